"""A constant-velocity Kalman filter on a box's centre, aspect ratio and height: the motion model ByteTrack
(after SORT / DeepSORT) predicts a track's box with while its detections are missing.

State (8,): cx, cy, a = w / h, h and their velocities per frame. The noise scales with the box height, so a
near (large) object may move more pixels per frame than a far one.
"""

from __future__ import annotations

import numpy as np

# standard deviations as fractions of the box height: of a position, of a velocity per frame
POSITION_STD = 1.0 / 20
VELOCITY_STD = 1.0 / 160


def xyxy_to_xyah(box: np.ndarray) -> np.ndarray:
    """(4,) x1, y1, x2, y2 -> (4,) cx, cy, w / h, h."""
    w, h = box[2] - box[0], box[3] - box[1]
    return np.array([box[0] + w / 2, box[1] + h / 2, w / max(h, 1e-6), h])


def xyah_to_xyxy(xyah: np.ndarray) -> np.ndarray:
    """(4,) cx, cy, w / h, h -> (4,) x1, y1, x2, y2."""
    w = xyah[2] * xyah[3]
    return np.array([xyah[0] - w / 2, xyah[1] - xyah[3] / 2, xyah[0] + w / 2, xyah[1] + xyah[3] / 2])


class BoxKalmanFilter:
    """One track's state: `mean` (8,) and `covariance` (8, 8), started from a first box (x1, y1, x2, y2)."""

    _motion = np.eye(8) + np.eye(8, k=4)  # x' = x + v (one frame)
    _observation = np.eye(4, 8)  # the box part of the state is what a detection measures

    def __init__(self, box: np.ndarray) -> None:
        measured = xyxy_to_xyah(box)
        h = measured[3]
        self.mean = np.concatenate([measured, np.zeros(4)])
        std = [2 * POSITION_STD * h, 2 * POSITION_STD * h, 1e-2, 2 * POSITION_STD * h]
        std += [10 * VELOCITY_STD * h, 10 * VELOCITY_STD * h, 1e-5, 10 * VELOCITY_STD * h]
        self.covariance = np.diag(np.square(std))

    @property
    def box(self) -> np.ndarray:
        """(4,) x1, y1, x2, y2 of the current state."""
        return xyah_to_xyxy(self.mean[:4])

    def predict(self, keep_height_velocity: bool = True) -> None:
        """One frame ahead. `keep_height_velocity` False zeroes the height's velocity first (a lost track's
        box should not keep growing or shrinking while nothing confirms it)."""
        if not keep_height_velocity:
            self.mean[7] = 0.0
        h = self.mean[3]
        std = [POSITION_STD * h, POSITION_STD * h, 1e-2, POSITION_STD * h]
        std += [VELOCITY_STD * h, VELOCITY_STD * h, 1e-5, VELOCITY_STD * h]
        self.mean = self._motion @ self.mean
        self.covariance = self._motion @ self.covariance @ self._motion.T + np.diag(np.square(std))

    def update(self, box: np.ndarray) -> None:
        """Correct the state with a detected box (x1, y1, x2, y2)."""
        h = self.mean[3]
        noise = np.diag(np.square([POSITION_STD * h, POSITION_STD * h, 1e-1, POSITION_STD * h]))
        projected_cov = self._observation @ self.covariance @ self._observation.T + noise  # (4, 4)
        # gain K = P H^T S^-1, solved rather than inverted: S is symmetric positive definite
        gain = np.linalg.solve(projected_cov, self._observation @ self.covariance).T  # (8, 4)
        innovation = xyxy_to_xyah(box) - self.mean[:4]
        self.mean = self.mean + gain @ innovation
        self.covariance = self.covariance - gain @ projected_cov @ gain.T
