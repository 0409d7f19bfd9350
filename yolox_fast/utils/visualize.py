"""Boxes on images, drawn one way everywhere: detections, training targets, assignments (one colour per class
or per ground truth, a filled tag with the label)."""

from __future__ import annotations

import colorsys
from collections.abc import Sequence

import cv2
import numpy as np


def class_color(cls: int) -> tuple[int, int, int]:
    """A BGR colour for class `cls`; hues step by the golden ratio so neighbouring ids differ clearly."""
    hue = (cls * 0.618033988749895) % 1.0
    r, g, b = colorsys.hsv_to_rgb(hue, 0.85, 0.95)
    return int(255 * b), int(255 * g), int(255 * r)


def draw_boxes(
    img: np.ndarray,
    boxes: np.ndarray,
    labels: Sequence[str],
    colors: Sequence[tuple[int, int, int]],
    thickness: int | None = None,
) -> np.ndarray:
    """A copy of BGR `img` with `boxes` (K, 4) x1, y1, x2, y2 px, box k in `colors[k]` with `labels[k]` in
    a filled tag above it (inside it when the box touches the top edge).

    Boxes with a non-finite coordinate are not drawn; the others are clipped to the image (an untrained
    model can predict boxes too large for OpenCV's int coordinates). Line width and font follow the
    image size: readable on a 320 px image, not oversized on a 4K frame.
    """
    out = img.copy()
    h, w = out.shape[:2]
    font_scale = max(0.35, min(h, w) / 1500.0)
    thickness = thickness or max(1, round(min(h, w) / 400.0))
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    finite = np.isfinite(boxes).all(axis=1)
    clipped = np.rint(np.clip(boxes, -1, [w, h, w, h])).astype(int).tolist()
    for (x1, y1, x2, y2), label, color, ok in zip(clipped, labels, colors, finite.tolist()):
        if not ok:
            continue
        cv2.rectangle(out, (x1, y1), (x2, y2), color, thickness)
        (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, font_scale, 1)
        top = y1 - th - base - 2 if y1 - th - base - 2 >= 0 else y1
        cv2.rectangle(out, (x1, top), (x1 + tw + 2, top + th + base + 2), color, -1)
        text_color = (0, 0, 0) if sum(color) > 382 else (255, 255, 255)
        cv2.putText(
            out,
            label,
            (x1 + 1, top + th + 1),
            cv2.FONT_HERSHEY_SIMPLEX,
            font_scale,
            text_color,
            1,
            cv2.LINE_AA,
        )
    return out


def class_name(class_names: Sequence[str], cls: int) -> str:
    return class_names[cls] if 0 <= cls < len(class_names) else str(cls)


def draw_detections(
    img: np.ndarray, dets: np.ndarray, class_names: Sequence[str], min_score: float = 0.0
) -> np.ndarray:
    """A copy of BGR `img` with boxes and "name score%" labels for `dets` (K, 6) [x1, y1, x2, y2, score, cls]
    in their class colours (`draw_boxes`); detections scoring below `min_score` are not drawn."""
    dets = np.asarray(dets, dtype=np.float64).reshape(-1, 6)
    dets = dets[np.nan_to_num(dets[:, 4], nan=-1.0) >= min_score]
    classes = np.nan_to_num(dets[:, 5]).astype(int).tolist()
    labels = [f"{class_name(class_names, c)} {100 * s:.1f}%" for c, s in zip(classes, dets[:, 4].tolist())]
    return draw_boxes(img, dets[:, :4], labels, [class_color(c) for c in classes])


def draw_targets(img: np.ndarray, targets: np.ndarray, class_names: Sequence[str]) -> np.ndarray:
    """A copy of BGR `img` with training targets (M, 5) [cls, cx, cy, w, h] px (all-zero rows are
    padding), named and coloured by class (`draw_boxes`)."""
    targets = np.asarray(targets, dtype=np.float64).reshape(-1, 5)
    targets = targets[targets.sum(1) > 0]
    cx, cy, w, h = targets[:, 1], targets[:, 2], targets[:, 3], targets[:, 4]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    classes = targets[:, 0].astype(int).tolist()
    return draw_boxes(
        img, boxes, [class_name(class_names, c) for c in classes], [class_color(c) for c in classes]
    )


def draw_tracks(img: np.ndarray, tracks: np.ndarray, class_names: Sequence[str]) -> np.ndarray:
    """A copy of BGR `img` with `tracks` (T, 7) [x1, y1, x2, y2, track id, score, cls], each labelled
    "id name" in a colour of its id, so that an object keeps its colour from frame to frame."""
    tracks = np.asarray(tracks, dtype=np.float64).reshape(-1, 7)
    ids = tracks[:, 4].astype(int).tolist()
    classes = tracks[:, 6].astype(int).tolist()
    labels = [f"{i} {class_name(class_names, c)}" for i, c in zip(ids, classes)]
    return draw_boxes(img, tracks[:, :4], labels, [class_color(i) for i in ids])
