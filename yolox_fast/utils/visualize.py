"""Drawing detections on images: one colour per class, a filled label with the class name and score."""

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


def draw_detections(
    img: np.ndarray, dets: np.ndarray, class_names: Sequence[str], min_score: float = 0.0
) -> np.ndarray:
    """A copy of BGR `img` with boxes and "name score%" labels for `dets` (K, 6) [x1, y1, x2, y2, score, cls].

    Detections scoring below `min_score`, or with non-finite coordinates, are not drawn; boxes are
    clipped to the image (an untrained model can predict boxes too large for OpenCV's int coordinates).
    """
    out = img.copy()
    h, w = out.shape[:2]
    # readable on a 320 px image, not oversized on a 4K frame
    font_scale = max(0.35, min(h, w) / 1500.0)
    thickness = max(1, round(min(h, w) / 400.0))
    dets = np.asarray(dets, dtype=np.float64).reshape(-1, 6)
    dets = dets[np.isfinite(dets).all(axis=1) & (dets[:, 4] >= min_score)]
    boxes = np.rint(np.clip(dets[:, :4], -1, [w, h, w, h])).astype(int).tolist()
    for (x1, y1, x2, y2), score, cls in zip(boxes, dets[:, 4].tolist(), dets[:, 5].astype(int).tolist()):
        color = class_color(cls)
        p1, p2 = (x1, y1), (x2, y2)
        cv2.rectangle(out, p1, p2, color, thickness)
        name = class_names[cls] if 0 <= cls < len(class_names) else str(cls)
        label = f"{name} {100 * score:.1f}%"
        (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, font_scale, 1)
        # label above the box, or inside it when the box touches the top edge
        top = p1[1] - th - base - 2 if p1[1] - th - base - 2 >= 0 else p1[1]
        cv2.rectangle(out, (p1[0], top), (p1[0] + tw + 2, top + th + base + 2), color, -1)
        text_color = (0, 0, 0) if sum(color) > 382 else (255, 255, 255)
        cv2.putText(
            out,
            label,
            (p1[0] + 1, top + th + 1),
            cv2.FONT_HERSHEY_SIMPLEX,
            font_scale,
            text_color,
            1,
            cv2.LINE_AA,
        )
    return out
