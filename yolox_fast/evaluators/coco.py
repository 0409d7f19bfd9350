"""COCO-style evaluation: AP50:95 / AP50 (faster-coco-eval or pycocotools), per-class AP and AR tables."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from loguru import logger
from pycocotools.coco import COCO
from tabulate import tabulate

from yolox_fast.evaluators.detection_evaluator import DetectionEvaluator, InferenceResult
from yolox_fast.evaluators.scorer import COCO_MAX_DETS, coco_evaluate, per_class_coco_ap, summary_text
from yolox_fast.inference import Detections


def coco_results_table(detections: dict[Any, Detections], class_ids: Sequence[int]) -> np.ndarray:
    """The (D, 7) float64 table [image_id, x, y, w, h, score, category_id] of every detection, images in
    id order and each image's rows in their order (COCOeval breaks score ties by it).

    `detections` maps image id -> (K, 6) [x1, y1, x2, y2, score, class index] in original pixels;
    `class_ids[i]` is the COCO category id of contiguous class index i.
    """
    ids = sorted(detections)
    parts = [np.asarray(detections[i], dtype=np.float64).reshape(-1, 6) for i in ids]
    dets = np.concatenate(parts) if parts else np.zeros((0, 6))  # (D, 6)
    table = np.empty((len(dets), 7), dtype=np.float64)
    table[:, 0] = np.repeat(np.asarray(ids, dtype=np.float64), [len(p) for p in parts])
    table[:, 1:3] = dets[:, :2]
    table[:, 3:5] = dets[:, 2:4] - dets[:, :2]
    table[:, 5] = dets[:, 4]
    table[:, 6] = np.asarray(class_ids, dtype=np.float64)[dets[:, 5].astype(np.int64)]
    return table


def detections_to_coco_json(
    detections: dict[Any, Detections], class_ids: Sequence[int]
) -> list[dict[str, Any]]:
    """COCO result records [{"image_id", "category_id", "bbox": [x, y, w, h], "score"}, ...] of
    `coco_results_table`'s rows (for small sets: one dict per detection)."""
    return [
        {"image_id": int(i), "category_id": int(c), "bbox": [x, y, w, h], "score": s}
        for i, x, y, w, h, s, c in coco_results_table(detections, class_ids).tolist()
    ]


def write_coco_results(path: str, table: np.ndarray, rows_per_write: int = 100_000) -> None:
    """Write a `coco_results_table` as a COCO results json file, `rows_per_write` rows at a time: no dict
    per detection, and the text of one chunk in memory at once."""
    with open(path, "w") as f:
        f.write("[")
        for start in range(0, len(table), rows_per_write):
            if start:
                f.write(", ")
            f.write(
                ", ".join(
                    f'{{"image_id": {int(i)}, "category_id": {int(c)}, "bbox": [{x!r}, {y!r}, {w!r}, {h!r}], '
                    f'"score": {s!r}}}'
                    for i, x, y, w, h, s, c in table[start : start + rows_per_write].tolist()
                )
            )
        f.write("]")


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
    table = coco_results_table(detections, class_ids)
    img_ids = sorted(detections)
    score = coco_evaluate(coco_gt, table, img_ids, scorer)
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
    (contiguous class index -> category id). Each image keeps the COCO_MAX_DETS best detections of each
    class, all that COCOeval scores (see `scorer.COCO_MAX_DETS`): the AP is that of every detection,
    and rank 0's memory is bounded however many boxes an untrained model puts out. After `evaluate`,
    `self.last_result` holds the full result dict (per-class tables, number of images scored, timing)
    on every rank. `scorer` picks the COCOeval implementation ("auto": faster-coco-eval when installed,
    else pycocotools); the log names the one that ran.
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
        self.max_per_class = COCO_MAX_DETS
        self.scorer = scorer
        self.testdev = testdev
        self.testdev_json = testdev_json
        self.per_class_AP = per_class_AP
        self.per_class_AR = per_class_AR

    def score(self, merged: InferenceResult) -> dict[str, Any]:
        dataset = self.dataloader.dataset
        class_ids = list(dataset.class_ids)
        if self.testdev:
            table = coco_results_table(merged.detections, class_ids)
            os.makedirs(os.path.dirname(os.path.abspath(self.testdev_json)), exist_ok=True)
            write_coco_results(self.testdev_json, table)
            text = (
                f"test-dev: wrote {len(table)} detections to {self.testdev_json} "
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
