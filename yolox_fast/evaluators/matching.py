"""Matching detections to ground truth for the eval report: precision/recall at a confidence, the
precision-recall and F1 curves, and the confusion matrix, the same way for COCO and VOC data.

Ground truth per image (`ImageTruth`) comes from the dataset's records (boxes in original pixels,
VOC "difficult" flags) plus, for a COCO-format set, its crowd annotations. Difficult and crowd boxes
are *ignore* regions: a detection that lands on one (and on no regular box) is neither a true nor a
false positive, and they are never counted as missed. Overlap with a regular or difficult box is IoU;
with a crowd box it is the intersection over the detection's area, as in pycocotools.

Class-aware matching at one IoU threshold (`match_detections`, what precision, recall and the curves
use), as pycocotools does for a single threshold: within an image, detections in descending score
(ties: input order) each take the not yet taken regular box of their class with the highest overlap
>= the threshold (true positive); failing that, a detection overlapping an ignore box of its class by
>= the threshold is ignored; otherwise it is a false positive. It matches every detection it is
given (a COCO evaluation has kept the 100 best of each class per image, all that COCOeval scores); the
APs of the report's table come from the dataset format's own scorer, not from this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from yolox_fast.inference import Detections

TP, FP, IGNORED = 1, 0, -1


@dataclass
class ImageTruth:
    """Ground truth of one image, original pixels."""

    boxes: np.ndarray  # (M, 4) float64 x1, y1, x2, y2
    classes: np.ndarray  # (M,) int64 contiguous class index
    ignore: np.ndarray  # (M,) bool: difficult (VOC) or crowd (COCO) regions
    crowd: np.ndarray  # (M,) bool: overlap measured as intersection / detection area

    @property
    def regular(self) -> np.ndarray:
        return ~self.ignore


def image_truth(
    boxes: np.ndarray, classes: np.ndarray, ignore: np.ndarray | None = None, crowd: np.ndarray | None = None
) -> ImageTruth:
    """An ImageTruth from array-likes (ignore and crowd default to all False)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    m = len(boxes)
    return ImageTruth(
        boxes=boxes,
        classes=np.asarray(classes, dtype=np.int64).reshape(m),
        ignore=np.zeros(m, bool) if ignore is None else np.asarray(ignore, dtype=bool).reshape(m),
        crowd=np.zeros(m, bool) if crowd is None else np.asarray(crowd, dtype=bool).reshape(m),
    )


def ground_truth_of(dataset, img_ids: Sequence[Any]) -> dict[Any, ImageTruth]:
    """The ImageTruth of each image in `img_ids` from an eval dataset's `.records`; a COCO-format set
    (one with `.coco` and `.class_ids`) adds its crowd annotations as ignore regions."""
    records = {r.img_id: r for r in dataset.records}
    coco, class_ids = getattr(dataset, "coco", None), getattr(dataset, "class_ids", None)
    index = {int(cid): i for i, cid in enumerate(class_ids)} if class_ids is not None else {}
    truths = {}
    for img_id in img_ids:
        rec = records[img_id]
        boxes, classes = [np.asarray(rec.boxes, np.float64).reshape(-1, 4)], [np.asarray(rec.classes)]
        ignore, crowd = [np.asarray(rec.difficult, bool)], [np.zeros(len(rec.boxes), bool)]
        if coco is not None and class_ids is not None:
            anns = coco.loadAnns(coco.getAnnIds(imgIds=[img_id], iscrowd=True))
            if anns:
                x, y, w, h = np.array([a["bbox"] for a in anns], dtype=np.float64).T
                boxes.append(np.stack([x, y, x + w, y + h], axis=1))
                classes.append(np.array([index[int(a["category_id"])] for a in anns]))
                ignore.append(np.ones(len(anns), bool))
                crowd.append(np.ones(len(anns), bool))
        truths[img_id] = image_truth(
            np.concatenate(boxes), np.concatenate(classes), np.concatenate(ignore), np.concatenate(crowd)
        )
    return truths


def overlaps(det_boxes: np.ndarray, gt_boxes: np.ndarray, crowd: np.ndarray) -> np.ndarray:
    """(D, M) overlap of each detection with each ground-truth box (x1y1x2y2): IoU, or for crowd
    columns the intersection over the detection's area. Degenerate boxes give 0."""
    d = np.asarray(det_boxes, np.float64).reshape(-1, 1, 4)
    g = np.asarray(gt_boxes, np.float64).reshape(1, -1, 4)
    iw = np.clip(np.minimum(d[..., 2], g[..., 2]) - np.maximum(d[..., 0], g[..., 0]), 0, None)
    ih = np.clip(np.minimum(d[..., 3], g[..., 3]) - np.maximum(d[..., 1], g[..., 1]), 0, None)
    inter = iw * ih
    det_area = np.clip(d[..., 2] - d[..., 0], 0, None) * np.clip(d[..., 3] - d[..., 1], 0, None)
    gt_area = np.clip(g[..., 2] - g[..., 0], 0, None) * np.clip(g[..., 3] - g[..., 1], 0, None)
    union = np.where(np.asarray(crowd, bool)[None, :], det_area, det_area + gt_area - inter)
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def match_detections(dets: Detections, truth: ImageTruth, iou_thr: float = 0.5) -> np.ndarray:
    """Class-aware greedy matching of one image (see the module docstring) -> (K,) int8 per detection
    row: TP (1), FP (0) or IGNORED (-1). `dets`: (K, 6) [x1, y1, x2, y2, score, class]."""
    dets = np.asarray(dets, np.float64).reshape(-1, 6)
    out = np.full(len(dets), FP, dtype=np.int8)
    if len(dets) == 0 or len(truth.boxes) == 0:
        return out
    ov = overlaps(dets[:, :4], truth.boxes, truth.crowd)  # (K, M)
    ov[dets[:, 5].astype(np.int64)[:, None] != truth.classes[None, :]] = 0.0
    hits = ov >= iou_thr
    regular = truth.regular
    on_ignore = (hits & ~regular[None, :]).any(1)
    can_take = (hits & regular[None, :]).any(1)
    taken = np.zeros(len(truth.boxes), bool)
    for k in np.argsort(-dets[:, 4], kind="stable"):
        if can_take[k]:
            free = hits[k] & regular & ~taken
            if free.any():
                j = int(np.argmax(np.where(free, ov[k], -1.0)))
                taken[j] = True
                out[k] = TP
                continue
        if on_ignore[k]:
            out[k] = IGNORED
    return out


@dataclass
class ClassMatches:
    """One class's matched detections over the whole eval set."""

    scores: np.ndarray  # (D,) descending; ignored detections left out
    tp: np.ndarray  # (D,) bool, True for a true positive
    num_gt: int  # regular (not ignored) ground-truth boxes of the class
    num_images: int  # images with at least one of them


def match_by_class(
    detections: Mapping[Any, Detections],
    truths: Mapping[Any, ImageTruth],
    num_classes: int,
    iou_thr: float = 0.5,
) -> list[ClassMatches]:
    """`match_detections` on every image of `truths` (a missing entry in `detections` means none),
    grouped by class -> one ClassMatches per class index 0..num_classes-1."""
    scores: list[list[np.ndarray]] = [[] for _ in range(num_classes)]
    flags: list[list[np.ndarray]] = [[] for _ in range(num_classes)]
    num_gt = np.zeros(num_classes, np.int64)
    num_images = np.zeros(num_classes, np.int64)
    for img_id, truth in truths.items():
        counts = np.bincount(truth.classes[truth.regular], minlength=num_classes)[:num_classes]
        num_gt += counts
        num_images += counts > 0
        dets = np.asarray(detections.get(img_id, np.zeros((0, 6))), np.float64).reshape(-1, 6)
        result = match_detections(dets, truth, iou_thr)
        keep = result != IGNORED
        cls = dets[keep, 5].astype(np.int64)
        for c in np.unique(cls):
            scores[c].append(dets[keep, 4][cls == c])
            flags[c].append(result[keep][cls == c] == TP)
    out = []
    for c in range(num_classes):
        s = np.concatenate(scores[c]) if scores[c] else np.zeros(0)
        t = np.concatenate(flags[c]) if flags[c] else np.zeros(0, bool)
        order = np.argsort(-s, kind="stable")
        out.append(ClassMatches(s[order], t[order], int(num_gt[c]), int(num_images[c])))
    return out


def precision_recall_at(m: ClassMatches, confs: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """Precision and recall of the detections with score >= each confidence -> two arrays shaped like
    `confs`. Precision is 0 where no detection passes; recall is nan for a class without ground truth."""
    confs = np.asarray(confs, np.float64)
    n = np.searchsorted(-m.scores, -confs, side="right")  # detections with score >= conf
    cum_tp = np.concatenate([[0], np.cumsum(m.tp)])
    tp = cum_tp[n]
    precision = np.divide(tp, n, out=np.zeros(confs.shape), where=n > 0)
    recall = tp / m.num_gt if m.num_gt else np.full(confs.shape, np.nan)
    return precision, recall


def pr_envelope(m: ClassMatches, recall_points: np.ndarray) -> np.ndarray:
    """Interpolated precision (the best precision at recall >= r) at each recall point -> (R,); 0 for
    recall never reached, all nan for a class without ground truth. The mean over 101 points
    0, 0.01, ..., 1 is COCO's AP definition applied to this module's matching."""
    recall_points = np.asarray(recall_points, np.float64)
    if m.num_gt == 0:
        return np.full(recall_points.shape, np.nan)
    cum_tp = np.cumsum(m.tp)
    recall = cum_tp / m.num_gt
    precision = cum_tp / np.arange(1, len(cum_tp) + 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1] if len(precision) else precision
    idx = np.searchsorted(recall, recall_points, side="left")  # first detection reaching r
    out = np.zeros(recall_points.shape)
    reached = idx < len(recall)
    out[reached] = envelope[idx[reached]]
    return out


def f1_curves(matches: Sequence[ClassMatches], confs: np.ndarray) -> np.ndarray:
    """F1 = 2PR / (P + R) of each class at each confidence -> (C, N); 0 where P + R = 0, nan for a class
    without ground truth."""
    out = np.full((len(matches), len(confs)), np.nan)
    for c, m in enumerate(matches):
        if m.num_gt:
            p, r = precision_recall_at(m, confs)
            out[c] = np.divide(2 * p * r, p + r, out=np.zeros(len(confs)), where=(p + r) > 0)
    return out


def best_f1(f1: np.ndarray, confs: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(best mean F1, its confidence, the mean F1 curve (N,)): the mean is over classes with ground
    truth; at a tie the lowest confidence (highest recall) wins."""
    with_gt = ~np.isnan(f1).all(axis=1)
    if not with_gt.any():
        return float("nan"), float("nan"), np.full(len(confs), np.nan)
    mean = f1[with_gt].mean(axis=0)
    i = int(np.argmax(mean))
    return float(mean[i]), float(confs[i]), mean


def confusion_matrix(
    detections: Mapping[Any, Detections],
    truths: Mapping[Any, ImageTruth],
    num_classes: int,
    conf: float = 0.25,
    iou_thr: float = 0.45,
) -> np.ndarray:
    """Counts (C + 1, C + 1): rows the true class, columns the predicted class; row C (background) holds
    false detections, column C (background) missed ground truths; [C, C] is always 0.

    Per image, detections with score >= `conf` and the regular ground-truth boxes are matched
    class-agnostically: among all (detection, box) pairs with IoU >= `iou_thr`, the pair of highest IoU
    is taken (ties: the higher-scored detection, then the earlier row, then the earlier box), its
    detection and box leave, and so on: each detection matches at most one box and each box one
    detection. A matched pair counts at [true class, predicted class] (the diagonal when they
    agree); an unmatched box at [class, background]; an unmatched detection at [background, class],
    unless it overlaps an ignore region (difficult or crowd box, any class) by >= `iou_thr`: then it
    is not counted. Ignore regions are never counted as missed.
    """
    bg = num_classes
    cm = np.zeros((num_classes + 1, num_classes + 1), np.int64)
    for img_id, truth in truths.items():
        dets = np.asarray(detections.get(img_id, np.zeros((0, 6))), np.float64).reshape(-1, 6)
        dets = dets[dets[:, 4] >= conf]
        det_cls = dets[:, 5].astype(np.int64)
        regular = truth.regular
        gt_boxes, gt_cls = truth.boxes[regular], truth.classes[regular]
        det_free = np.ones(len(dets), bool)
        gt_free = np.ones(len(gt_boxes), bool)
        if len(dets) and len(gt_boxes):
            iou = overlaps(dets[:, :4], gt_boxes, np.zeros(len(gt_boxes), bool))
            d_idx, g_idx = np.nonzero(iou >= iou_thr)
            order = np.lexsort((g_idx, d_idx, -dets[d_idx, 4], -iou[d_idx, g_idx]))
            for d, g in zip(d_idx[order], g_idx[order]):
                if det_free[d] and gt_free[g]:
                    det_free[d] = gt_free[g] = False
                    cm[gt_cls[g], det_cls[d]] += 1
        np.add.at(cm, (gt_cls[gt_free], bg), 1)
        unmatched = np.nonzero(det_free)[0]
        if len(unmatched) and truth.ignore.any():
            ov = overlaps(dets[unmatched, :4], truth.boxes[truth.ignore], truth.crowd[truth.ignore])
            unmatched = unmatched[~(ov >= iou_thr).any(1)]
        np.add.at(cm, (bg, det_cls[unmatched]), 1)
    return cm


def row_normalised(cm: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (rows summing to 0 stay 0)."""
    sums = cm.sum(axis=1, keepdims=True).astype(np.float64)
    return np.divide(cm, sums, out=np.zeros(cm.shape), where=sums > 0)
