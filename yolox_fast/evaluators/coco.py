"""COCO-style evaluation: AP50:95 / AP50 (faster-coco-eval or pycocotools), per-class AP and AR tables."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from loguru import logger
from pycocotools.coco import COCO
from tabulate import tabulate

from yolox_fast.evaluators.detection_evaluator import DetectionEvaluator, InferenceResult
from yolox_fast.evaluators.scorer import coco_evaluate, per_class_coco_ap, summary_text
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


def _grouped_table(values: dict[str, float], metric: str, columns: int = 6) -> str:
    """Per-class figures laid out `columns` (class, value) pairs per row, so 80 classes fit a screen."""
    flat: list[Any] = []
    for name, value in values.items():
        flat += [name, 100 * value]
    width = 2 * columns
    rows = [flat[i : i + width] for i in range(0, len(flat), width)]
    headers = ["class", metric] * (min(columns, max(len(values), 1)))
    return tabulate(rows, headers=headers, tablefmt="pipe", floatfmt=".3f", numalign="left")


def coco_score(
    coco_gt: COCO,
    detections: dict[Any, Detections],
    class_ids: Sequence[int],
    class_names: Sequence[str] | None = None,
    scorer: str = "auto",
) -> dict[str, Any]:
    """Score `detections` (image id -> (K, 6) original px) against `coco_gt`, every listed image once.

    Images present in `detections` with no rows still count (their ground truth becomes misses).
    `scorer`: "auto" (faster-coco-eval when installed), "faster-coco-eval" or "pycocotools" (see
    `evaluators.scorer`). Returns {"ap50_95", "ap50", "stats" (the twelve summary numbers), "summary"
    (pycocotools' text), "scorer" (library and version), "scorer_s" (its seconds), "per_class"
    (metric -> list over contiguous classes, see `scorer.per_class_coco_ap`), "per_class_ap",
    "per_class_ar" (AP50:95 and AR100 by class name), "num_images" (images scored)}.
    """
    records = detections_to_coco_json(detections, class_ids)
    img_ids = sorted(detections)
    score = coco_evaluate(coco_gt, records, img_ids, scorer)
    per_class = per_class_coco_ap(score)
    # the K axis follows the sorted category ids; reorder to the contiguous class index
    column = {cat_id: k for k, cat_id in enumerate(score.cat_ids)}
    order = [column[int(cid)] for cid in class_ids]
    per_class = {key: values[order].tolist() for key, values in per_class.items()}
    names = [str(n) for n in class_names] if class_names is not None else [str(c) for c in class_ids]
    return {
        "ap50_95": float(score.stats[0]),
        "ap50": float(score.stats[1]),
        "stats": score.stats.tolist(),
        "summary": summary_text(score.stats),
        "scorer": score.scorer,
        "scorer_s": score.seconds,
        "per_class": per_class,
        "per_class_ap": dict(zip(names, per_class["AP50_95"])),
        "per_class_ar": dict(zip(names, per_class["AR100"])),
        "num_images": len(img_ids),
    }


class COCOEvaluator(DetectionEvaluator):
    """AP of a model on a COCO-format eval loader (single process or one shard per rank).

    The loader's dataset must have `.coco` (pycocotools COCO of the split) and `.class_ids`
    (contiguous class index -> category id). After `evaluate`, `self.last_result` holds the full
    result dict (per-class tables, number of images scored, timing) on every rank. `scorer` picks
    the COCOeval implementation ("auto": faster-coco-eval when installed, else pycocotools); the
    log names the one that ran.
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
        scorer: str = "auto",
    ) -> None:
        super().__init__(dataloader, img_size, confthre, nmsthre, num_classes, class_names)
        self.scorer = scorer
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
        result = coco_score(dataset.coco, merged.detections, class_ids, names, self.scorer)
        logger.info(f"COCO AP scored by {result['scorer']} in {result['scorer_s']:.2f} s")
        text = result["summary"]
        if self.per_class_AP:
            text += "per class AP:\n" + _grouped_table(result["per_class_ap"], "AP") + "\n"
        if self.per_class_AR:
            text += "per class AR:\n" + _grouped_table(result["per_class_ar"], "AR") + "\n"
        return {**result, "summary": text}
