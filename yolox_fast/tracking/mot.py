"""The MOT Challenge text format: one line per tracked box, `frame,id,x,y,w,h,score,-1,-1,-1`, frames
counted from 1, boxes as top-left corner and size in pixels (what MOT evaluation kits and most tracking
tools read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def mot_lines(frame: int, tracks: np.ndarray) -> list[str]:
    """Lines for `tracks` (T, 7) [x1, y1, x2, y2, track id, score, class] of frame `frame` (from 1)."""
    return [
        f"{frame},{int(tid)},{x1:.2f},{y1:.2f},{x2 - x1:.2f},{y2 - y1:.2f},{score:.4f},-1,-1,-1"
        for x1, y1, x2, y2, tid, score, _ in tracks.tolist()
    ]


def read_mot(path: str | Path) -> dict[int, np.ndarray]:
    """{frame: (T, 6) [track id, x1, y1, x2, y2, score]} of a MOT text file."""
    rows = np.loadtxt(path, delimiter=",", ndmin=2)
    frames: dict[int, np.ndarray] = {}
    for frame in np.unique(rows[:, 0]).astype(int).tolist():
        r = rows[rows[:, 0] == frame]
        frames[frame] = np.stack(
            [r[:, 1], r[:, 2], r[:, 3], r[:, 2] + r[:, 4], r[:, 3] + r[:, 5], r[:, 6]], 1
        )
    return frames
