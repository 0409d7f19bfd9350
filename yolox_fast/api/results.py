"""The detections of one image as `YOLOX.predict` returns them: boxes in the image's pixels, scores, class
ids and names, and ways to draw, save and hand them on (JSON, supervision's Detections)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from loguru import logger

from yolox_fast.core.demo import detections_to_records
from yolox_fast.utils.extras import require
from yolox_fast.utils.visualize import draw_detections


@dataclass
class Results:
    """Detections of one image. `boxes` (K, 4) float64 x1, y1, x2, y2 in the original image's pixels,
    `scores` (K,) objectness x class confidence, `class_ids` (K,) int64, `names` every class name of the
    model by class id, `image` the image as read (H, W, 3) uint8 BGR, `path` its file (None for an array)."""

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    names: tuple[str, ...]
    image: np.ndarray
    path: str | None = None

    @classmethod
    def from_detections(cls, dets: np.ndarray, names, image: np.ndarray, path: str | None) -> Results:
        """From the Predictor's (K, 6) [x1, y1, x2, y2, score, class] rows."""
        return cls(
            dets[:, :4].copy(), dets[:, 4].copy(), dets[:, 5].astype(np.int64), tuple(names), image, path
        )

    def __len__(self) -> int:
        return len(self.boxes)

    @property
    def detections(self) -> np.ndarray:
        """(K, 6) [x1, y1, x2, y2, score, class] float64, the Predictor's layout."""
        return np.column_stack([self.boxes, self.scores, self.class_ids]).reshape(-1, 6)

    @property
    def class_names(self) -> list[str]:
        """The class name of each detection."""
        return [self.names[c] if 0 <= c < len(self.names) else str(c) for c in self.class_ids.tolist()]

    def plot(self) -> np.ndarray:
        """A copy of the image (H, W, 3) uint8 BGR with the boxes drawn, named and scored."""
        return draw_detections(self.image, self.detections, self.names)

    def save(self, path: str | Path | None = None) -> str:
        """Write `plot()` to `path` (default: `<file stem>_pred.jpg` in the working directory); returns it."""
        if path is None:
            if self.path is None:
                raise ValueError("this image came from an array: give save() a path")
            path = f"{Path(self.path).stem}_pred.jpg"
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(path), self.plot()):
            raise ValueError(f"cannot write {path} (an image suffix OpenCV knows: .jpg, .png, ...)")
        return str(path)

    def to_records(self) -> list[dict[str, Any]]:
        """[{"bbox": [x1, y1, x2, y2], "score", "class_id", "class_name"}], what `demo --save-json` writes."""
        return detections_to_records(self.detections, self.names)

    def to_json(self) -> str:
        return json.dumps(self.to_records())

    def to_supervision(self):
        """The detections as a `supervision.Detections` (`pip install "yolox_fast[supervision]"`), with each
        detection's class name in its `data["class_name"]`."""
        supervision = require("supervision", "supervision")
        finite = np.isfinite(self.boxes).all(axis=1)  # (K,): supervision refuses inf/nan coordinates
        if not finite.all():
            dropped = int((~finite).sum())
            logger.warning(f"to_supervision: {dropped} boxes with non-finite coordinates left out")
        return supervision.Detections(
            xyxy=self.boxes[finite].astype(np.float32).reshape(-1, 4),
            confidence=self.scores[finite].astype(np.float32),
            class_id=self.class_ids[finite].astype(int),
            data={"class_name": np.array(self.class_names, dtype=str)[finite]},
        )
