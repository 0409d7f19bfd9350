"""The plain IoU tracker (Bochinski et al., AVSS 2017), the baseline ByteTrack is measured against: each
confident detection continues the track whose last box it overlaps most (minimum-cost assignment on
1 - IoU, IoU >= `min_iou`, any class, as ByteTrack); a track with no box this frame ends; a box left over
starts a new track. No motion model, no memory of lost tracks, no low-score boxes."""

from __future__ import annotations

import numpy as np

from yolox_fast.tracking.association import iou_cost, match


class IoUTracker:
    """`update` once per frame, in order; the same input and output as `ByteTracker.update`."""

    def __init__(self, min_score: float = 0.5, min_iou: float = 0.3) -> None:
        self.min_score = min_score
        self.min_iou = min_iou
        self._tracks = np.zeros((0, 7))  # (T, 7) last box, id, score, class of the live tracks
        self._next_id = 1

    def update(self, detections: np.ndarray) -> np.ndarray:
        """(K, 6) [x1, y1, x2, y2, score, class] -> this frame's tracks (T, 7) [x1, y1, x2, y2, id, score,
        class]."""
        dets = np.asarray(detections, dtype=np.float64).reshape(-1, 6)
        dets = dets[dets[:, 4] >= self.min_score]
        cost = iou_cost(self._tracks[:, :4], dets[:, :4])
        pairs, _, new = match(cost, 1.0 - self.min_iou)
        ids = [self._tracks[t, 4] for t, _ in pairs] + list(range(self._next_id, self._next_id + len(new)))
        self._next_id += len(new)
        order = [d for _, d in pairs] + new
        kept = dets[order]
        self._tracks = np.column_stack([kept[:, :4], np.array(ids, dtype=np.float64), kept[:, 4:6]])
        return self._tracks.copy()
