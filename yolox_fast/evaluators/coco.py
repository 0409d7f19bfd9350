"""COCO-style evaluation: AP50:95 / AP50 with pycocotools, plus per-class AP and AR tables."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from loguru import logger
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from tabulate import tabulate

from yolox_fast.evaluators.detection_evaluator import DetectionEvaluator, InferenceResult
from yolox_fast.inference import Detections


def detections_to_coco_json(
    detections: dict[Any, Detections], class_ids: Sequence[int]
) -> list[dict[str, Any]]:
    """COCO result records [{"image_id", "category_id", "bbox": [x, y, w, h], "score"}, ...].

    `detections` maps image id -> (K, 6) [x1, y1, x2, y2, score, class index] in original pixels;
    `class_ids[i]` is the COCO category id of contiguous class index i.
    """
    records = []
    for img_id in sorted(detections):
        for x1, y1, x2, y2, score, cls in detections[img_id].tolist():
            records.append(
                {
                    "image_id": img_id,
                    "category_id": int(class_ids[int(cls)]),
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "score": score,
                }
            )
    return records


def _load_results(coco_gt: COCO, records: list[dict[str, Any]]) -> COCO:
    """`coco_gt.loadRes`, which cannot take an empty list: no detections is a valid (AP 0) result."""
    if records:
        with contextlib.redirect_stdout(io.StringIO()):
            # loadRes adds keys to the records it is given
            return coco_gt.loadRes([dict(r) for r in records])
    coco_dt = COCO()
    coco_dt.dataset = {
        "images": list(coco_gt.dataset["images"]),
        "categories": list(coco_gt.dataset["categories"]),
        "annotations": [],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt.createIndex()
    return coco_dt


def _grouped_table(values: dict[str, float], metric: str, columns: int = 6) -> str:
    """Per-class figures laid out `columns` (class, value) pairs per row, so 80 classes fit a screen."""
    flat: list[Any] = []
    for name, value in values.items():
        flat += [name, 100 * value]
    width = 2 * columns
    rows = [flat[i : i + width] for i in range(0, len(flat), width)]
    headers = ["class", metric] * (min(columns, max(len(values), 1)))
    return tabulate(rows, headers=headers, tablefmt="pipe", floatfmt=".3f", numalign="left")


def per_class_ap_ar(coco_eval: COCOeval, names: dict[int, str]) -> tuple[dict[str, float], dict[str, float]]:
    """AP@[.5:.95] and AR@100 per category (area "all"), keyed by class name; nan where undefined."""
    precision = coco_eval.eval["precision"]  # (T iou, R recall, K class, A area, M maxdets)
    recall = coco_eval.eval["recall"]  # (T, K, A, M)
    ap, ar = {}, {}
    for k, cat_id in enumerate(coco_eval.params.catIds):
        name = names.get(cat_id, str(cat_id))
        p = precision[:, :, k, 0, -1]
        r = recall[:, k, 0, -1]
        ap[name] = float(np.mean(p[p > -1])) if (p > -1).any() else float("nan")
        ar[name] = float(np.mean(r[r > -1])) if (r > -1).any() else float("nan")
    return ap, ar


def coco_score(
    coco_gt: COCO,
    detections: dict[Any, Detections],
    class_ids: Sequence[int],
    class_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Score `detections` (image id -> (K, 6) original px) against `coco_gt`, every listed image once.

    Images present in `detections` with no rows still count (their ground truth becomes misses).
    Returns {"ap50_95", "ap50", "summary" (pycocotools text), "per_class_ap", "per_class_ar",
    "num_images" (images scored)}.
    """
    records = detections_to_coco_json(detections, class_ids)
    coco_dt = _load_results(coco_gt, records)
    coco_eval = COCOeval(coco_gt, coco_dt, "bbox")
    coco_eval.params.imgIds = sorted(detections)
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        coco_eval.evaluate()
        coco_eval.accumulate()
    text = io.StringIO()  # keep only the summary, not pycocotools' progress lines
    with contextlib.redirect_stdout(text):
        coco_eval.summarize()
    names = {}
    if class_names is not None:
        names = {int(cid): str(n) for cid, n in zip(class_ids, class_names)}
    ap, ar = per_class_ap_ar(coco_eval, names)
    return {
        "ap50_95": float(coco_eval.stats[0]),
        "ap50": float(coco_eval.stats[1]),
        "summary": text.getvalue(),
        "per_class_ap": ap,
        "per_class_ar": ar,
        "num_images": len(coco_eval.params.imgIds),
    }


class COCOEvaluator(DetectionEvaluator):
    """AP of a model on a COCO-format eval loader (single process or one shard per rank).

    The loader's dataset must have `.coco` (pycocotools COCO of the split) and `.class_ids`
    (contiguous class index -> category id). After `evaluate`, `self.last_result` holds the full
    result dict (per-class tables, number of images scored, timing) on every rank.
    """

    def __init__(
        self,
        dataloader,
        img_size: Sequence[int],
        confthre: float,
        nmsthre: float,
        num_classes: int,
        class_names: Sequence[str] | None = None,
        testdev: bool = False,
        testdev_json: str = "yolox_testdev_2017.json",
        per_class_AP: bool = True,
        per_class_AR: bool = True,
    ) -> None:
        super().__init__(dataloader, img_size, confthre, nmsthre, num_classes, class_names)
        self.testdev = testdev
        self.testdev_json = testdev_json
        self.per_class_AP = per_class_AP
        self.per_class_AR = per_class_AR

    def score(self, merged: InferenceResult) -> dict[str, Any]:
        dataset = self.dataloader.dataset
        class_ids = list(dataset.class_ids)
        if self.testdev:
            records = detections_to_coco_json(merged.detections, class_ids)
            os.makedirs(os.path.dirname(os.path.abspath(self.testdev_json)), exist_ok=True)
            with open(self.testdev_json, "w") as f:
                json.dump(records, f)
            text = (
                f"test-dev: wrote {len(records)} detections to {self.testdev_json} "
                "(score it on the evaluation server)\n"
            )
            logger.info(text.strip())
            return {"ap50_95": 0.0, "ap50": 0.0, "summary": text}
        names = self.class_names if self.class_names is not None else getattr(dataset, "class_names", None)
        result = coco_score(dataset.coco, merged.detections, class_ids, names)
        text = result["summary"]
        if self.per_class_AP:
            text += "per class AP:\n" + _grouped_table(result["per_class_ap"], "AP") + "\n"
        if self.per_class_AR:
            text += "per class AR:\n" + _grouped_table(result["per_class_ar"], "AR") + "\n"
        return {**result, "summary": text}
