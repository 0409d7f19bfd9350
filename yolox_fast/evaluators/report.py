"""The eval report: per-class table, confusion matrix, PR and F1 curves and the detections, as files.

`write_eval_report(evaluator, exp, out_dir)` runs after `evaluator.evaluate(...)` on the rank that
scored (rank 0) and writes into `out_dir`:

    per_class.csv                   class_id, class, images, instances, AP50_95, AP50, AP75, AP_small,
                                    AP_medium, AP_large, precision, recall, report_conf (fractions 0-1;
                                    empty = undefined), one row per class, then the "all" row
    confusion_matrix.png            counts (colour: share of the true-class row)
    confusion_matrix_normalized.png the same matrix, each true-class row divided by its sum
    confusion_matrix.json           {"classes", "rows": "true class", "columns": "predicted class",
                                    "conf", "iou", "matrix": counts (C + 1) x (C + 1)}
    PR_curve.png                    precision against recall at IoU 0.5, per class + mean, AP50 in the legend
    F1_curve.png                    F1 against confidence per class + mean, best threshold marked
    detections.json                 every detection in COCO results format (the dataset's image and
                                    category ids; for VOC the contiguous class index and the record's id)

The APs come from the format's scorer (COCO: COCOeval, areas small/medium/large as COCO defines them;
VOC: the devkit's AP at IoU 0.5, its mean over 0.50:0.95 and at 0.75, no area split: those columns
are empty / n/a). Images / instances count the regular ground truth (no difficult or crowd boxes);
the "all" row counts every scored image and instance and averages the classes that have ground
truth. Precision, recall, the curves and the confusion matrix follow `evaluators.matching`
(precision is 0 when no detection passes the confidence).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from loguru import logger
from tabulate import tabulate

from yolox_fast.evaluators import matching
from yolox_fast.evaluators.coco import coco_results_table, write_coco_results
from yolox_fast.inference import Detections

AP_COLUMNS = ("AP50_95", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")
CSV_COLUMNS = ("class_id", "class", "images", "instances", *AP_COLUMNS, "precision", "recall", "report_conf")
TABLE_HEADERS = ("AP50:95", "AP50", "AP75", "APs", "APm", "APl")
RECALL_POINTS = np.linspace(0.0, 1.0, 1001)
CONF_POINTS = np.linspace(0.0, 1.0, 1001)

FILES = {
    "table": "per_class.csv",
    "cm": "confusion_matrix.png",
    "cm_normalized": "confusion_matrix_normalized.png",
    "cm_json": "confusion_matrix.json",
    "pr": "PR_curve.png",
    "f1": "F1_curve.png",
    "detections": "detections.json",
}


def check_report_settings(report_conf: float, cm_conf: float, cm_iou: float) -> None:
    """ValueError naming the exp field when a threshold is outside its range."""
    for name, value in (("report_conf", report_conf), ("cm_conf", cm_conf)):
        if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
            raise ValueError(f"exp.{name} must be a confidence in [0, 1], got {value!r}")
    if not (isinstance(cm_iou, (int, float)) and 0.0 < cm_iou <= 1.0):
        raise ValueError(f"exp.cm_iou must be an IoU in (0, 1], got {cm_iou!r}")


@dataclass
class EvalReport:
    """Everything the report files show (class axes: contiguous class index 0..C-1)."""

    class_names: list[str]
    rows: list[dict[str, Any]]  # CSV_COLUMNS per class, then the "all" row; nan = undefined
    confusion: np.ndarray  # (C + 1, C + 1) counts, rows true class, columns predicted, last = background
    precision: np.ndarray  # (C, R) interpolated precision at RECALL_POINTS (IoU 0.5); nan rows: no gt
    f1: np.ndarray  # (C, N) F1 at CONF_POINTS; nan rows: no gt
    mean_f1: np.ndarray  # (N,)
    best_f1: float
    best_conf: float
    report_conf: float
    cm_conf: float
    cm_iou: float

    @property
    def best_f1_text(self) -> str:
        return f"best F1 {self.best_f1:.2f} at conf {self.best_conf:.2f}"


def build_report(
    detections: Mapping[Any, Detections],
    truths: Mapping[Any, matching.ImageTruth],
    per_class_ap: Mapping[str, Sequence[float]],
    class_names: Sequence[str],
    report_conf: float = 0.25,
    cm_conf: float = 0.25,
    cm_iou: float = 0.45,
) -> EvalReport:
    """The report of `detections` (image id -> (K, 6) original px) against `truths` (every scored image).

    `per_class_ap`: metric name (AP_COLUMNS) -> per-class values from the format's scorer (the
    evaluator result's "per_class"); a missing metric is undefined (nan) for every class.
    """
    check_report_settings(report_conf, cm_conf, cm_iou)
    names = [str(n) for n in class_names]
    num_classes = len(names)
    matches = matching.match_by_class(detections, truths, num_classes, iou_thr=0.5)
    ap = {k: np.asarray(per_class_ap.get(k, [np.nan] * num_classes), np.float64) for k in AP_COLUMNS}
    rows = []
    for c, m in enumerate(matches):
        p, r = matching.precision_recall_at(m, report_conf)
        rows.append(
            {
                "class_id": c,
                "class": names[c],
                "images": m.num_images,
                "instances": m.num_gt,
                **{k: float(ap[k][c]) for k in AP_COLUMNS},
                "precision": float(p) if m.num_gt else float("nan"),
                "recall": float(r),
                "report_conf": report_conf,
            }
        )
    with_gt = [row for row in rows if row["instances"] > 0]
    rows.append(
        {
            "class_id": "",
            "class": "all",
            "images": sum(1 for t in truths.values() if t.regular.any()),
            "instances": sum(m.num_gt for m in matches),
            **{k: _nanmean([row[k] for row in with_gt]) for k in (*AP_COLUMNS, "precision", "recall")},
            "report_conf": report_conf,
        }
    )
    precision = np.stack([matching.pr_envelope(m, RECALL_POINTS) for m in matches])
    f1 = matching.f1_curves(matches, CONF_POINTS)
    best, best_conf, mean_f1 = matching.best_f1(f1, CONF_POINTS)
    cm = matching.confusion_matrix(detections, truths, num_classes, cm_conf, cm_iou)
    return EvalReport(names, rows, cm, precision, f1, mean_f1, best, best_conf, report_conf, cm_conf, cm_iou)


def _nanmean(values: Sequence[float]) -> float:
    values = np.asarray(values, np.float64)
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else float("nan")


def report_table(report: EvalReport) -> str:
    """The per-class table as text (tabulate), fractions with 3 decimals, n/a where undefined."""
    conf = f"{report.report_conf:g}"
    headers = ("class", "images", "instances", *TABLE_HEADERS, f"P@{conf}", f"R@{conf}")

    def cell(v):
        return "n/a" if isinstance(v, float) and np.isnan(v) else v

    rows = [
        [row["class"], row["images"], row["instances"]]
        + [cell(row[k]) for k in (*AP_COLUMNS, "precision", "recall")]
        for row in report.rows
    ]
    return tabulate(rows, headers=headers, tablefmt="simple", floatfmt=".3f", numalign="right")


def _write_csv(report: EvalReport, path: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in report.rows:
            writer.writerow({k: "" if isinstance(v, float) and np.isnan(v) else v for k, v in row.items()})


def report_figures(report: EvalReport) -> dict[str, Any]:
    """{"cm", "cm_normalized", "pr", "f1"} -> matplotlib Figure."""
    from yolox_fast.evaluators import plots

    ap50 = [row["AP50"] for row in report.rows[:-1]]
    return {
        "cm": plots.confusion_matrix_figure(
            report.confusion, report.class_names, False, report.cm_conf, report.cm_iou
        ),
        "cm_normalized": plots.confusion_matrix_figure(
            report.confusion, report.class_names, True, report.cm_conf, report.cm_iou
        ),
        "pr": plots.pr_figure(
            RECALL_POINTS, report.precision, report.class_names, ap50, report.rows[-1]["AP50"]
        ),
        "f1": plots.f1_figure(
            CONF_POINTS, report.f1, report.class_names, report.mean_f1, report.best_f1, report.best_conf
        ),
    }


def save_report(
    report: EvalReport,
    out_dir: str,
    detections: Mapping[Any, Detections],
    class_ids: Sequence[int],
    tracker=None,
    step: int = 0,
) -> list[str]:
    """Write the report files into `out_dir` (created); returns their paths. With a `tracker` (the
    trainer's `core.trackers.Trackers`), the four pictures also go to it as val/<name> at `step`."""
    from yolox_fast.evaluators import plots

    os.makedirs(out_dir, exist_ok=True)
    paths = {key: os.path.join(out_dir, name) for key, name in FILES.items()}
    _write_csv(report, paths["table"])
    names = [*report.class_names, "background"]
    with open(paths["cm_json"], "w") as f:
        json.dump(
            {
                "classes": names,
                "rows": "true class",
                "columns": "predicted class",
                "conf": report.cm_conf,
                "iou": report.cm_iou,
                "matrix": report.confusion.tolist(),
            },
            f,
            indent=1,
        )
    for key, fig in report_figures(report).items():
        rgb = plots.save_figure(fig, paths[key])
        if tracker is not None:
            tracker.log_images(f"val/{FILES[key][:-4]}", [rgb], step)
    write_coco_results(paths["detections"], coco_results_table(detections, class_ids))
    return list(paths.values())


def _evaluator_inputs(evaluator) -> tuple[dict[Any, Detections], dict[Any, matching.ImageTruth], list, list]:
    dataset = evaluator.dataloader.dataset
    detections = evaluator.last_merged.detections
    truths = matching.ground_truth_of(dataset, sorted(detections))
    names = evaluator.class_names or getattr(dataset, "class_names", None)
    names = list(names) if names else [str(c) for c in range(evaluator.num_classes)]
    class_ids = list(getattr(dataset, "class_ids", range(len(names))))
    return detections, truths, names, class_ids


def write_eval_report(evaluator, exp, out_dir: str, tracker=None, step: int = 0) -> EvalReport | None:
    """Build and write the report of the evaluator's last `evaluate` into `out_dir`, with the exp's
    `report_conf`, `cm_conf` and `cm_iou`. Returns None on a rank that did not score (nothing to do)."""
    if getattr(evaluator, "last_merged", None) is None:
        return None
    detections, truths, names, class_ids = _evaluator_inputs(evaluator)
    report = build_report(
        detections,
        truths,
        evaluator.last_result.get("per_class", {}),
        names,
        exp.report_conf,
        exp.cm_conf,
        exp.cm_iou,
    )
    save_report(report, out_dir, detections, class_ids, tracker, step)
    return report


def log_eval_report(report: EvalReport, out_dir: str) -> None:
    """The table, the best F1 and one line naming the files (tools/eval.py)."""
    logger.info(f"per-class results (P/R at conf {report.report_conf:g}, IoU 0.5):\n{report_table(report)}")
    logger.info(f"{report.best_f1_text} (mean over classes, IoU 0.5; see F1_curve.png)")
    logger.info(f"eval report written to {out_dir}: {', '.join(FILES.values())}")


def _replace_dir(src: str, dst: str) -> None:
    tmp = dst + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)


def record_training_eval(evaluator, exp, save_dir: str, tracker, epoch: int, is_best: bool) -> None:
    """The trainer's hook after each evaluation: the report into `<save_dir>/eval/` (the latest), a
    copy into `<save_dir>/best_eval/` when this epoch is the best, the pictures to the run's trackers.
    A no-op on ranks that did not score and when `exp.save_eval_report` is False. A failure is logged
    as a warning and never stops training."""
    if not getattr(exp, "save_eval_report", True) or getattr(evaluator, "last_merged", None) is None:
        return
    out_dir = os.path.join(save_dir, "eval")
    try:
        report = write_eval_report(evaluator, exp, out_dir, tracker, epoch)
        where = out_dir
        if is_best:
            best_dir = os.path.join(save_dir, "best_eval")
            _replace_dir(out_dir, best_dir)
            where += f" and {best_dir}"
        logger.info(f"eval report epoch {epoch}: {report.best_f1_text}; tables and pictures in {where}")
    except Exception as err:  # noqa: BLE001 -- a plot or a full disk must not end a training run
        logger.warning(f"eval report of epoch {epoch} not written: {type(err).__name__}: {err}")
