"""Generated videos with known tracks, to measure trackers: objects that move, cross each other and pass
behind occluders, the frames drawn with OpenCV, and a detector simulated from the truth (box noise, scores
that fall with occlusion, misses, false positives).

Kinds: "crossing" (pairs walking towards each other on nearly the same line, the nearer one hiding the
other as they pass), "occlusion" (objects walking behind two pillars, unseen for several frames) and
"mixed" (objects bouncing around a frame with one pillar, crossing at random).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

KINDS = ("crossing", "occlusion", "mixed")
# visible fraction of a box below which a detector sees nothing, and below which its score drops
HIDDEN, PARTLY_HIDDEN = 0.25, 0.6
_GRID = 4  # px per cell of the visibility raster


@dataclass
class Scene:
    """One generated video. `boxes` (F, N, 4) x1, y1, x2, y2 of the N objects in each of the F frames (ids are
    1 + the object index); `visible` (F, N) the fraction of each box not hidden (by a nearer object or a
    pillar); `pillars` (P, 4) the occluders' boxes; `depth` (N,) smaller is nearer the camera."""

    size: tuple[int, int]  # (H, W)
    boxes: np.ndarray
    visible: np.ndarray
    pillars: np.ndarray
    depth: np.ndarray

    @property
    def num_frames(self) -> int:
        return len(self.boxes)

    def truth(self, frame: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids (M,), boxes (M, 4)) of frame `frame` (from 0): the objects a detector could see there."""
        seen = self.visible[frame] >= HIDDEN
        return np.nonzero(seen)[0] + 1, self.boxes[frame, seen]


def make_scene(kind: str, seed: int, num_frames: int = 150, size: tuple[int, int] = (480, 640)) -> Scene:
    """A scene of `kind` (see KINDS), the same for the same `seed`."""
    if kind not in KINDS:
        raise ValueError(f"unknown scene kind {kind!r}; one of {', '.join(KINDS)}")
    rng = np.random.default_rng(seed)
    h, w = size
    t = np.arange(num_frames)[:, None]  # (F, 1)
    if kind == "crossing":
        pairs = 3
        n = 2 * pairs
        lanes = np.linspace(0.3, 0.8, pairs) * h
        y = np.repeat(lanes, 2) + rng.uniform(-8, 8, n)
        speed = rng.uniform(2.5, 4.5, n) * np.tile([1, -1], pairs)
        # each pair meets at a random time in the middle half of the video, near the middle of the frame
        meet = np.repeat(rng.uniform(0.25, 0.75, pairs) * num_frames, 2)
        meet_x = np.repeat(rng.uniform(0.35, 0.65, pairs) * w, 2)
        cx = meet_x + speed * (t - meet)  # (F, N)
        cy = np.broadcast_to(y + rng.uniform(-0.3, 0.3, n) * (t - meet) / 10, cx.shape)
        pillars = np.zeros((0, 4))
    elif kind == "occlusion":
        n = 6
        pillars = np.array([[0.3 * w, 0, 0.3 * w + 70, h], [0.65 * w, 0, 0.65 * w + 70, h]])
        y = rng.uniform(0.2, 0.85, n) * h
        speed = rng.uniform(2.0, 4.0, n) * rng.choice([-1, 1], n)
        start = np.where(speed > 0, rng.uniform(-60, 0.15 * w, n), rng.uniform(0.85 * w, w + 60, n))
        cx = start + speed * t
        cy = np.broadcast_to(y + rng.uniform(-0.2, 0.2, n) * t, cx.shape)
    else:
        n = 8
        pillars = np.array([[0.45 * w, 0, 0.45 * w + 60, h]])
        cx, cy = _bouncing(rng, n, num_frames, w, h)
    bw = rng.uniform(35, 60, n)
    bh = bw * rng.uniform(1.5, 2.2, n)
    boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=-1)  # (F, N, 4)
    depth = rng.permutation(n).astype(np.float64)
    visible = np.stack([_visible_fractions(f, depth, pillars, size) for f in boxes])
    return Scene(size, boxes, visible, pillars, depth)


def _bouncing(rng, n: int, num_frames: int, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """(F, N) centres of objects moving at constant speed, reflected at the frame's edges."""
    pos = rng.uniform([60, 80], [w - 60, h - 80], (n, 2))
    angle = rng.uniform(0, 2 * np.pi, n)
    vel = rng.uniform(2.0, 4.0, (n, 1)) * np.stack([np.cos(angle), np.sin(angle)], axis=1)
    lo, hi = np.array([30.0, 50.0]), np.array([w - 30.0, h - 50.0])
    out = np.empty((num_frames, n, 2))
    for f in range(num_frames):
        out[f] = pos
        pos = pos + vel
        bounced = (pos < lo) | (pos > hi)
        vel = np.where(bounced, -vel, vel)
        pos = np.clip(pos, lo, hi)
    return out[..., 0], out[..., 1]


def _visible_fractions(boxes: np.ndarray, depth: np.ndarray, pillars: np.ndarray, size) -> np.ndarray:
    """(N,) fraction of each box (N, 4) inside the frame and not covered by a nearer box or a pillar, on a
    raster of _GRID px cells."""
    gh, gw = size[0] // _GRID, size[1] // _GRID
    owner = np.full((gh, gw), -1)
    for i in np.argsort(-depth):  # far to near: the nearer paints over
        owner[_cells(boxes[i], gh, gw)] = i
    for pillar in pillars:
        owner[_cells(pillar, gh, gw)] = -2
    counts = np.bincount(owner[owner >= 0].ravel(), minlength=len(boxes))
    areas = np.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / _GRID**2, 1.0)
    return np.clip(counts / areas, 0.0, 1.0)


def _cells(box: np.ndarray, gh: int, gw: int) -> tuple[slice, slice]:
    x1, y1, x2, y2 = (np.clip(np.round(np.asarray(box) / _GRID), 0, [gw, gh, gw, gh])).astype(int)
    return slice(y1, y2), slice(x1, x2)


def simulate_detections(
    scene: Scene, seed: int, miss_rate: float = 0.03, false_per_frame: float = 0.3
) -> list[np.ndarray]:
    """Per frame, (K, 6) [x1, y1, x2, y2, score, class 0] as a decent detector would give: each object seen
    (visible >= HIDDEN) is found with probability 1 - `miss_rate`, its box jittered by 3% of its size (6%
    when partly hidden), score in [0.55, 0.95], or in [0.15, 0.5] when less than PARTLY_HIDDEN of it
    shows; plus Poisson(`false_per_frame`) false boxes scoring in [0.1, 0.6]."""
    rng = np.random.default_rng(seed)
    h, w = scene.size
    frames = []
    for f in range(scene.num_frames):
        boxes, vis = scene.boxes[f], scene.visible[f]
        found = (vis >= HIDDEN) & (rng.random(len(vis)) >= miss_rate)
        partly = vis < PARTLY_HIDDEN
        size = np.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]] * 2, axis=1)  # (N, 4)
        jitter = rng.normal(0, 1, (len(vis), 4)) * size * np.where(partly, 0.06, 0.03)[:, None]
        score = np.where(partly, rng.uniform(0.15, 0.5, len(vis)), rng.uniform(0.55, 0.95, len(vis)))
        dets = np.column_stack([boxes + jitter, score, np.zeros(len(vis))])[found]
        false = rng.poisson(false_per_frame)
        if false:
            centre = rng.uniform([0, 0], [w, h], (false, 2))
            half = rng.uniform(15, 50, (false, 2)) * [1, 1.8]
            fake = np.column_stack(
                [centre - half, centre + half, rng.uniform(0.1, 0.6, false), np.zeros(false)]
            )
            dets = np.concatenate([dets, fake])
        frames.append(dets)
    return frames


def draw_frame(scene: Scene, frame: int) -> np.ndarray:
    """(H, W, 3) uint8 BGR picture of frame `frame`: a textured floor, the objects as filled figures far to
    near, the pillars in front."""
    h, w = scene.size
    yy, xx = np.mgrid[0:h, 0:w]
    floor = (90 + 25 * ((xx // 40 + yy // 40) % 2)).astype(np.uint8)
    img = np.repeat(floor[..., None], 3, axis=2)
    for i in np.argsort(-scene.depth):
        x1, y1, x2, y2 = np.round(scene.boxes[frame, i]).astype(int)
        hue = (i * 0.618033988749895) % 1.0
        color = cv2.cvtColor(np.uint8([[[int(hue * 179), 200, 230]]]), cv2.COLOR_HSV2BGR)[0, 0].tolist()
        head = max((x2 - x1) // 3, 2)
        cv2.rectangle(img, (x1, y1 + 2 * head), (x2, y2), color, -1)
        cv2.circle(img, ((x1 + x2) // 2, y1 + head), head, color, -1)
    for x1, y1, x2, y2 in np.round(scene.pillars).astype(int):
        cv2.rectangle(img, (x1, y1), (x2, y2), (60, 60, 70), -1)
    return img
