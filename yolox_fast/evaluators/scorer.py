"""COCO box scoring with faster-coco-eval (C++) when installed, pycocotools otherwise.

Both compute the same COCOeval (IoU 0.50:0.95, areas all/small/medium/large, maxDets 1/10/100): on
generated sets with crowd boxes, empty images and classes without detections the twelve summary
numbers and the precision arrays agree within the tests' 1e-4 (tests/test_eval_report.py; the
differences seen were float rounding, under 1e-15). faster-coco-eval's
evaluate + accumulate are C++: `python tools/benchmark.py eval` measures the difference. The summary
text is always written here in pycocotools' twelve-line format, whichever library ran, so people and
scripts that parse it see the same lines.
"""

from __future__ import annotations

import contextlib
import copy
import io
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

SCORERS = ("auto", "faster-coco-eval", "pycocotools")

# (AP or AR, IoU label, area, maxDets) of pycocotools' summarize(), in its order
SUMMARY_LINES = (
    (1, "0.50:0.95", "all", 100),
    (1, "0.50", "all", 100),
    (1, "0.75", "all", 100),
    (1, "0.50:0.95", "small", 100),
    (1, "0.50:0.95", "medium", 100),
    (1, "0.50:0.95", "large", 100),
    (0, "0.50:0.95", "all", 1),
    (0, "0.50:0.95", "all", 10),
    (0, "0.50:0.95", "all", 100),
    (0, "0.50:0.95", "small", 100),
    (0, "0.50:0.95", "medium", 100),
    (0, "0.50:0.95", "large", 100),
)


@dataclass
class COCOScore:
    """What one COCOeval run produced."""

    stats: np.ndarray  # (12,) pycocotools' summary numbers (AP50:95, AP50, AP75, APs, APm, APl, AR1, ...)
    precision: np.ndarray  # (T=10 IoU, R=101 recall, K classes, A=4 areas, M=3 maxDets); -1 where undefined
    recall: np.ndarray  # (T, K, A, M); -1 where undefined
    iou_thresholds: np.ndarray  # (T,)
    cat_ids: list[int]  # the K category ids, in the order of the K axis (sorted)
    scorer: str  # "faster-coco-eval 1.8.0" or "pycocotools 2.0.11"
    seconds: float  # evaluate + accumulate + summarize


def faster_coco_eval_available() -> bool:
    try:
        import faster_coco_eval  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_scorer(scorer: str) -> str:
    """The scorer that runs: "auto" is "faster-coco-eval" when it imports, else "pycocotools"."""
    if scorer not in SCORERS:
        raise ValueError(f"unknown COCO scorer {scorer!r}: expected one of {', '.join(SCORERS)}")
    if scorer == "auto":
        return "faster-coco-eval" if faster_coco_eval_available() else "pycocotools"
    if scorer == "faster-coco-eval" and not faster_coco_eval_available():
        raise ImportError(
            "COCO scorer 'faster-coco-eval' requested but not installed: pip install faster-coco-eval"
        )
    return scorer


def summary_text(stats: Sequence[float]) -> str:
    """pycocotools' `COCOeval.summarize()` output for these twelve numbers, character for character."""
    lines = []
    for value, (is_ap, iou, area, max_dets) in zip(stats, SUMMARY_LINES):
        title, kind = ("Average Precision", "(AP)") if is_ap else ("Average Recall", "(AR)")
        lines.append(
            f" {title:<18} {kind} @[ IoU={iou:<9} | area={area:>6s} | maxDets={max_dets:>3d} ] = {value:0.3f}"
        )
    return "\n".join(lines) + "\n"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


# COCOeval scores, in each image, the `maxDets[-1]` = 100 best-scored detections of each category and
# ignores the rest (evaluateImg and computeIoU both cut after a stable sort by score). So dropping the
# others before scoring, keeping the survivors' order, changes no number it reports: see
# `detection_evaluator.top_per_class`.
COCO_MAX_DETS = 100

# detections a COCOeval pass holds at once: the categories are scored in groups under this (COCOeval is
# separable by category, see `coco_evaluate`), so 5,000 images of an untrained model do not need tens of
# millions of result dicts at once (about 0.6 KB each in the scorers)
MAX_PASS_DETS = 1_000_000

# loadRes gives each box result without a "segmentation" a polygon of its corners (a list of 8 floats, about
# 0.3 KB), which bbox scoring never reads; one shared empty list stands in for all of them
_NO_SEGMENTATION: list = []


def results_table(records: Sequence[dict[str, Any]]) -> np.ndarray:
    """COCO result records ([{"image_id", "category_id", "bbox" xywh, "score"}]) as the (D, 7) float64
    table [image_id, x, y, w, h, score, category_id] that `coco_evaluate` scores."""
    rows = [[r["image_id"], *r["bbox"], r["score"], r["category_id"]] for r in records]
    return np.array(rows, dtype=np.float64).reshape(-1, 7)


def _result_dicts(table: np.ndarray) -> list[dict[str, Any]]:
    """The (D, 7) table as the result dicts loadRes takes (fresh ones: loadRes adds keys to them)."""
    return [
        {
            "image_id": int(i),
            "bbox": [x, y, w, h],
            "score": s,
            "category_id": int(c),
            "segmentation": _NO_SEGMENTATION,
        }
        for i, x, y, w, h, s, c in table.tolist()
    ]


def _pycocotools_results(coco_gt: COCO, records: list[dict[str, Any]]) -> COCO:
    """`coco_gt.loadRes`, which cannot take an empty list: no detections is a valid (AP 0) result."""
    with contextlib.redirect_stdout(io.StringIO()):
        if records:
            return coco_gt.loadRes(records)
        coco_dt = COCO()
        coco_dt.dataset = {
            "images": list(coco_gt.dataset["images"]),
            "categories": list(coco_gt.dataset["categories"]),
            "annotations": [],
        }
        coco_dt.createIndex()
    return coco_dt


# the faster-coco-eval copy of each ground truth (built once per pycocotools COCO: training evaluates
# the same split many times)
_FASTER_GT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _faster_gt(coco_gt: COCO):
    from faster_coco_eval import COCO as FasterCOCO

    gt = _FASTER_GT.get(coco_gt)
    if gt is None:
        # a deep copy: faster-coco-eval writes "ignore" flags into the annotations it evaluates
        gt = FasterCOCO(copy.deepcopy(coco_gt.dataset), print_function=lambda *a, **k: None)
        _FASTER_GT[coco_gt] = gt
    return gt


def _category_groups(cat_ids: list[int], counts: dict[int, int], max_dets: int) -> list[list[int]]:
    """`cat_ids` in order, cut into runs whose detections (`counts`) add up to at most `max_dets` (a
    category with more is a run of its own)."""
    groups: list[list[int]] = [[]]
    held = 0
    for cat in cat_ids:
        n = counts.get(cat, 0)
        if groups[-1] and held + n > max_dets:
            groups.append([])
            held = 0
        groups[-1].append(cat)
        held += n
    return groups


def _one_pass(name: str, coco_gt: COCO, table: np.ndarray, img_ids, cat_ids: list[int]):
    """COCOeval (evaluate + accumulate) of the rows of `table` on the categories `cat_ids`."""
    records = _result_dicts(table)
    if name == "faster-coco-eval":
        from faster_coco_eval import COCOeval_faster

        gt = _faster_gt(coco_gt)
        dt = gt.loadRes(records)  # an empty list gives an empty, evaluable result
        ev = COCOeval_faster(gt, dt, "bbox", print_function=lambda *a, **k: None)
        ev.params.imgIds, ev.params.catIds = list(img_ids), cat_ids
        ev.evaluate()
        ev.accumulate()
        return ev
    dt = _pycocotools_results(coco_gt, records)
    ev = COCOeval(coco_gt, dt, "bbox")
    ev.params.imgIds, ev.params.catIds = list(img_ids), cat_ids
    with contextlib.redirect_stdout(io.StringIO()):  # progress lines
        ev.evaluate()
        ev.accumulate()
    return ev


def summary_stats(precision: np.ndarray, recall: np.ndarray, iou_thresholds: np.ndarray) -> np.ndarray:
    """The twelve numbers of COCOeval.summarize() from its precision (T, R, K, A, M) and recall
    (T, K, A, M) arrays (areas all/small/medium/large, maxDets 1/10/100): each the mean of the defined
    (> -1) entries of its slice, -1 when none is."""
    stats = np.empty(len(SUMMARY_LINES))
    for i, (is_ap, iou, area, max_dets) in enumerate(SUMMARY_LINES):
        a, m = ("all", "small", "medium", "large").index(area), (1, 10, 100).index(max_dets)
        s = precision[..., a, m] if is_ap else recall[..., a, m]
        if iou != "0.50:0.95":
            s = s[np.where(iou_thresholds == float(iou))[0]]
        valid = s[s > -1]
        stats[i] = valid.mean() if valid.size else -1.0
    return stats


def coco_evaluate(
    coco_gt: COCO,
    results: np.ndarray | Sequence[dict[str, Any]],
    img_ids: Sequence[Any],
    scorer: str = "auto",
    max_pass_dets: int = MAX_PASS_DETS,
) -> COCOScore:
    """COCOeval ("bbox") of `results` on the images `img_ids` of `coco_gt` (a pycocotools COCO) by `scorer`
    ("auto", "faster-coco-eval", "pycocotools"). `results`: the (D, 7) table [image_id, x, y, w, h, score,
    category_id] or COCO result records. Neither `coco_gt` nor `results` is modified.

    COCOeval matches and accumulates each category on its own and summarises by averaging over the
    categories' precision and recall entries, so the categories are scored in groups of at most
    `max_pass_dets` detections and the arrays joined along the category axis: the same arrays, and the
    same twelve numbers, as one pass, with the result dicts of one group alive at a time.
    """
    table = results if isinstance(results, np.ndarray) else results_table(results)
    name = resolve_scorer(scorer)
    t0 = time.perf_counter()
    cat_ids = sorted(int(c) for c in coco_gt.getCatIds())
    found, counts = np.unique(table[:, 6].astype(np.int64), return_counts=True)
    groups = _category_groups(cat_ids, dict(zip(found.tolist(), counts.tolist())), max_pass_dets)
    precision, recall = [], []
    for group in groups:
        # a boolean mask keeps the rows' order: COCOeval breaks score ties by it
        ev = _one_pass(name, coco_gt, table[np.isin(table[:, 6], group)], img_ids, group)
        precision.append(np.asarray(ev.eval["precision"], dtype=np.float64))
        recall.append(np.asarray(ev.eval["recall"], dtype=np.float64))
        iou_thresholds = np.asarray(ev.params.iouThrs, dtype=np.float64)
        del ev
    precision_all, recall_all = np.concatenate(precision, axis=2), np.concatenate(recall, axis=1)
    stats = summary_stats(precision_all, recall_all, iou_thresholds)
    return COCOScore(
        stats=stats,
        precision=precision_all,
        recall=recall_all,
        iou_thresholds=iou_thresholds,
        cat_ids=cat_ids,
        scorer=f"{name} {_version(name)}",
        seconds=time.perf_counter() - t0,
    )


def _mean_valid(values: np.ndarray) -> float:
    valid = values[values > -1]
    return float(valid.mean()) if valid.size else float("nan")


def per_class_coco_ap(score: COCOScore) -> dict[str, np.ndarray]:
    """Per-class AP from a COCOeval precision array: {"AP50_95", "AP50", "AP75", "AP_small", "AP_medium",
    "AP_large", "AR100"} -> (K,) each, nan where the class has no ground truth (in that area range).

    Each is the per-class term of the summary number of the same name: the mean of the valid entries
    of the K classes equals `stats`.
    """
    p, r = score.precision, score.recall  # (T, R, K, A, M), (T, K, A, M)
    t50 = int(np.argmin(np.abs(score.iou_thresholds - 0.5)))
    t75 = int(np.argmin(np.abs(score.iou_thresholds - 0.75)))
    k = p.shape[2]
    out = {
        "AP50_95": [_mean_valid(p[:, :, c, 0, -1]) for c in range(k)],
        "AP50": [_mean_valid(p[t50, :, c, 0, -1]) for c in range(k)],
        "AP75": [_mean_valid(p[t75, :, c, 0, -1]) for c in range(k)],
        "AP_small": [_mean_valid(p[:, :, c, 1, -1]) for c in range(k)],
        "AP_medium": [_mean_valid(p[:, :, c, 2, -1]) for c in range(k)],
        "AP_large": [_mean_valid(p[:, :, c, 3, -1]) for c in range(k)],
        "AR100": [_mean_valid(r[:, c, 0, -1]) for c in range(k)],
    }
    return {key: np.asarray(v, dtype=np.float64) for key, v in out.items()}
