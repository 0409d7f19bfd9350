"""Pascal VOC evaluation: per-class AP at IoU 0.5 (VOC2007 11-point or area under the PR curve),
and the mean over IoU 0.50:0.05:0.95.

Matching follows the VOC devkit (VOCevaldet.m): detections of a class are taken by descending score;
each one is compared with the ground truth box of highest IoU in its image; IoU >= threshold and that
box not yet taken -> true positive; already taken -> false positive (duplicate); that box 'difficult'
-> ignored (neither TP nor FP). Difficult boxes do not count in the number of positives.

Boxes are in pixel-edge coordinates, as the VOC dataset records them (x1 = xmin - 1, x2 = xmax for the
devkit's 1-based inclusive indices), so w = x2 - x1 equals the devkit's xmax - xmin + 1 and IoU needs
no "+1" here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from loguru import logger
from tabulate import tabulate

from yolox_fast.evaluators.detection_evaluator import DetectionEvaluator, InferenceResult
from yolox_fast.inference import Detections

IOU_THRESHOLDS = tuple(np.round(np.arange(0.5, 0.951, 0.05), 2).tolist())  # 0.50, 0.55, ..., 0.95


def voc_ap(recall: np.ndarray, precision: np.ndarray, use_07_metric: bool = False) -> float:
    """AP from a precision/recall curve (both (D,), detections in descending-score order).

    use_07_metric: mean of the best precision at recall >= 0, 0.1, ..., 1 (VOC2007's 11 points);
    else the area under the monotone (right-to-left max) precision envelope, as VOC2010+.
    """
    recall = np.asarray(recall, dtype=np.float64)
    precision = np.asarray(precision, dtype=np.float64)
    if use_07_metric:
        ap = 0.0
        for t in np.arange(11) / 10.0:  # exact 0.3 etc., so recall 3/10 reaches its point
            reached = recall >= t
            ap += (precision[reached].max() if reached.any() else 0.0) / 11.0
        return float(ap)
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([0.0], precision, [0.0]))
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    steps = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of `box` (4,) with `boxes` (M, 4), x1y1x2y2 pixel-edge coordinates -> (M,)."""
    iw = np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0])
    ih = np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1])
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, np.finfo(np.float64).eps)


def voc_class_ap(
    image_ids: Sequence[Any],
    scores: np.ndarray,
    boxes: np.ndarray,
    ground_truth: Mapping[Any, tuple[np.ndarray, np.ndarray]],
    iou_thresholds: Sequence[float] = (0.5,),
    use_07_metric: bool = False,
) -> np.ndarray:
    """AP of one class at each IoU threshold -> (T,); nan when the class has no non-difficult box.

    image_ids (D,), scores (D,), boxes (D, 4) x1y1x2y2: this class's detections over all images.
    ground_truth: image id -> (boxes (M, 4), difficult (M,) bool) of this class (images without
    boxes of the class may be absent).
    """
    thresholds = np.asarray(iou_thresholds, dtype=np.float64)
    npos = sum(int((~np.asarray(d, dtype=bool)).sum()) for _, d in ground_truth.values())
    if npos == 0:
        return np.full(len(thresholds), np.nan)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    order = np.argsort(-scores, kind="stable")  # ties keep input order, like the devkit's sort

    taken = {img: np.zeros((len(thresholds), len(gt[0])), dtype=bool) for img, gt in ground_truth.items()}
    tp = np.zeros((len(thresholds), len(order)))
    fp = np.zeros((len(thresholds), len(order)))
    for rank, d in enumerate(order):
        gt = ground_truth.get(image_ids[d])
        if gt is None or len(gt[0]) == 0:
            fp[:, rank] = 1
            continue
        gt_boxes, difficult = np.asarray(gt[0], dtype=np.float64), np.asarray(gt[1], dtype=bool)
        ious = _iou(boxes[d], gt_boxes)
        j = int(np.argmax(ious))
        hit = ious[j] >= thresholds  # (T,)
        if difficult[j]:
            fp[~hit, rank] = 1  # a miss is a false positive; a hit on a difficult box is ignored
            continue
        claimed = taken[image_ids[d]][:, j]
        tp[hit & ~claimed, rank] = 1
        fp[~hit | claimed, rank] = 1
        claimed |= hit
    tp, fp = np.cumsum(tp, axis=1), np.cumsum(fp, axis=1)
    recall = tp / npos
    precision = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    return np.array([voc_ap(recall[t], precision[t], use_07_metric) for t in range(len(thresholds))])


def voc_map(
    detections: Mapping[Any, Detections],
    ground_truth: Mapping[Any, tuple[np.ndarray, np.ndarray, np.ndarray]],
    num_classes: int,
    iou_thresholds: Sequence[float] = IOU_THRESHOLDS,
    use_07_metric: bool = False,
) -> np.ndarray:
    """Per-class AP at each threshold -> (C, T), nan for classes without positives.

    detections: image id -> (K, 6) [x1, y1, x2, y2, score, class]; ground_truth: image id ->
    (boxes (M, 4), labels (M,), difficult (M,) bool), every scored image listed (possibly empty).
    """
    per_class_dets: dict[int, list[tuple[Any, np.ndarray]]] = defaultdict(list)
    for img_id, dets in detections.items():
        for c in np.unique(dets[:, 5]).astype(int):
            per_class_dets[c].append((img_id, dets[dets[:, 5] == c]))
    per_class_gt: dict[int, dict[Any, tuple[np.ndarray, np.ndarray]]] = defaultdict(dict)
    for img_id, (boxes, labels, difficult) in ground_truth.items():
        labels = np.asarray(labels).astype(int)
        for c in np.unique(labels):
            mask = labels == c
            per_class_gt[int(c)][img_id] = (np.asarray(boxes)[mask], np.asarray(difficult, dtype=bool)[mask])

    aps = np.full((num_classes, len(iou_thresholds)), np.nan)
    for c in range(num_classes):
        chunks = per_class_dets.get(c, [])
        ids = [img for img, d in chunks for _ in range(len(d))]
        dets = np.concatenate([d for _, d in chunks]) if chunks else np.zeros((0, 6))
        gt = per_class_gt.get(c, {})
        aps[c] = voc_class_ap(ids, dets[:, 4], dets[:, :4], gt, iou_thresholds, use_07_metric)
    return aps


class VOCEvaluator(DetectionEvaluator):
    """VOC mAP of a model on a VOC-format eval loader (single process or one shard per rank).

    Returns AP50:95 (mean over IoU 0.50:0.95) and AP50 as `evaluate`'s first two values, both means
    over classes that have ground truth. The ground truth comes from the loader's dataset
    `.records` (img_id, boxes (M, 4) original px, classes (M,), difficult (M,) per image).
    """

    def __init__(
        self,
        dataloader,
        img_size: Sequence[int],
        confthre: float,
        nmsthre: float,
        num_classes: int,
        class_names: Sequence[str] | None = None,
        use_07_metric: bool = True,
    ) -> None:
        super().__init__(dataloader, img_size, confthre, nmsthre, num_classes, class_names)
        self.use_07_metric = use_07_metric

    def score(self, merged: InferenceResult) -> dict[str, Any]:
        dataset = self.dataloader.dataset
        records = {r.img_id: r for r in dataset.records}
        # scored as the annotation files give them, as the VOC devkit does (see BoxClipCounter)
        ground_truth = {
            img_id: records[img_id].raw_gt
            or (records[img_id].boxes, records[img_id].classes, records[img_id].difficult)
            for img_id in merged.detections
        }
        aps = voc_map(merged.detections, ground_truth, self.num_classes, IOU_THRESHOLDS, self.use_07_metric)
        names = self.class_names or getattr(dataset, "class_names", None)
        names = names or [str(c) for c in range(self.num_classes)]
        with_gt = ~np.isnan(aps[:, 0])
        if not with_gt.any():
            raise ValueError("no ground truth box in the eval set: VOC mAP is undefined")
        skipped = [names[c] for c in np.where(~with_gt)[0]]
        if skipped:
            logger.info(
                f"VOC mAP: {len(skipped)} class(es) without ground truth left out of the mean: {skipped}"
            )
        ap50 = float(np.mean(aps[with_gt, 0]))
        ap50_95 = float(np.mean(aps[with_gt]))
        metric = "VOC2007 11-point" if self.use_07_metric else "area under PR curve"
        rows = [
            (names[c], f"{100 * aps[c, 0]:.2f}", f"{100 * np.mean(aps[c]):.2f}")
            for c in range(self.num_classes)
            if with_gt[c]
        ]
        rows.append(("mean", f"{100 * ap50:.2f}", f"{100 * ap50_95:.2f}"))
        table = tabulate(rows, headers=("class", "AP50", "AP50:95"), tablefmt="pipe")
        text = f"VOC AP ({metric}), {len(merged.detections)} images:\n{table}\n"
        return {
            "ap50_95": ap50_95,
            "ap50": ap50,
            "summary": text,
            "per_class_ap50": {names[c]: float(aps[c, 0]) for c in range(self.num_classes)},
            # by contiguous class, nan without ground truth: what the eval report's table shows
            "per_class": {
                "AP50_95": aps.mean(axis=1).tolist(),
                "AP50": aps[:, 0].tolist(),
                "AP75": aps[:, IOU_THRESHOLDS.index(0.75)].tolist(),
            },
        }
