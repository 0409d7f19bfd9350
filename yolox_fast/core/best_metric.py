"""Which evaluation number `best_ckpt.pth` keeps (`exp.best_metric`), and carrying it across a resume.

A checkpoint stores the best value as "best_ap" (YOLOX's key) and, from this version on, its name as
"best_metric". A checkpoint without the name (older runs, official YOLOX) holds AP50:95.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loguru import logger

BEST_METRICS = {"AP50_95": "AP50:95", "AP50": "AP50"}  # exp value -> how the log writes it
LEGACY_METRIC = "AP50_95"  # what "best_ap" meant before "best_metric" was stored


def check_best_metric(name: Any) -> str:
    """`name` if it is a known metric, else ValueError listing the choices."""
    if name not in BEST_METRICS:
        raise ValueError(f"exp.best_metric must be one of {', '.join(map(repr, BEST_METRICS))}, got {name!r}")
    return name


def metric_label(name: str) -> str:
    return BEST_METRICS[check_best_metric(name)]


def metric_value(name: str, ap50_95: float, ap50: float) -> float:
    """The number `name` picks out of an evaluation."""
    return {"AP50_95": ap50_95, "AP50": ap50}[check_best_metric(name)]


def resumed_best(ckpt: Mapping[str, Any], name: str) -> float:
    """The best value to compare against after resuming from `ckpt` with `exp.best_metric == name`:
    the stored best when it was measured by the same metric, otherwise -inf (the next evaluation
    becomes the best), with a warning, so AP50 is never compared with an AP50:95."""
    check_best_metric(name)
    if "best_ap" not in ckpt:
        return float("-inf")
    stored = ckpt.get("best_metric", LEGACY_METRIC)
    if stored != name:
        logger.warning(
            f"the checkpoint's best value {float(ckpt['best_ap']):.4f} is "
            f"{BEST_METRICS.get(stored, stored)}, but exp.best_metric is {name}: "
            "best_ckpt.pth restarts from the next evaluation"
        )
        return float("-inf")
    return float(ckpt["best_ap"])
