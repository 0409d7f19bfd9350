"""Matching tracks to detections: an IoU cost and a minimum-cost assignment with a gate."""

from __future__ import annotations

import numpy as np
import torch

from yolox_fast.utils.boxes import bboxes_iou


def iou_cost(track_boxes: np.ndarray, det_boxes: np.ndarray) -> np.ndarray:
    """(T, D) 1 - IoU of track boxes (T, 4) with detection boxes (D, 4), x1y1x2y2.

    Classes are not compared, as in ByteTrack: a real detector's class flips between look-alikes from
    frame to frame (a COCO nano calls one raccoon cat, dog and bear within 12 frames), and a track would
    break at each flip."""
    if len(track_boxes) == 0 or len(det_boxes) == 0:
        return np.ones((len(track_boxes), len(det_boxes)))
    return 1.0 - bboxes_iou(torch.from_numpy(track_boxes), torch.from_numpy(det_boxes)).numpy()


def match(cost: np.ndarray, max_cost: float) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Minimum total cost pairs (row, col) of `cost` (R, C) with cost <= `max_cost`; then the rows and
    columns left unmatched."""
    pairs = []
    if cost.size:
        # imported here: scipy.optimize takes 0.6 s to import, which a demo run without --track need not pay
        from scipy.optimize import linear_sum_assignment

        # pairs over the gate cost more than leaving both unmatched: priced out before solving, so the solver
        # never trades a good pair for two gated ones
        gated = np.where(cost <= max_cost, cost, max_cost + 1e3)
        rows, cols = linear_sum_assignment(gated)
        pairs = [(r, c) for r, c in zip(rows.tolist(), cols.tolist()) if cost[r, c] <= max_cost]
    matched_rows = {r for r, _ in pairs}
    matched_cols = {c for _, c in pairs}
    return (
        pairs,
        [r for r in range(cost.shape[0]) if r not in matched_rows],
        [c for c in range(cost.shape[1]) if c not in matched_cols],
    )
