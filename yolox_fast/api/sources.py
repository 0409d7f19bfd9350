"""What `YOLOX.predict` takes: image paths, folders, glob patterns, PIL images and arrays, one or a list,
read as (name, BGR uint8 (H, W, 3)) images, the layout the Predictor works in."""

from __future__ import annotations

import os
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from yolox_fast.core.sources import download, is_pattern, is_url, list_images
from yolox_fast.data import image_io

COLOR_ORDERS = ("bgr", "rgb")


def read_sources(
    sources: Any, color: str = "bgr", recursive: bool = False
) -> Iterator[tuple[str | None, np.ndarray]]:
    """(name, image (H, W, 3) uint8 BGR) for each image of `sources`, in order.

    A source is a path (an image file, a folder: its own images, and its subfolders' too with `recursive`,
    or a glob pattern such as `photos/*.jpg`; see `core.sources.list_images`), a PIL image, an array
    (H, W, 3) or (H, W) uint8, or (B, H, W, 3) for B images, in the `color` order ("bgr", as OpenCV reads,
    or "rgb", as PIL and most other libraries give), or a list of these. Names are the files' paths (None
    for arrays). An unreadable file is a ValueError naming it.
    """
    if color not in COLOR_ORDERS:
        raise ValueError(f"color must be one of {COLOR_ORDERS}, got {color!r}")
    for source in sources if isinstance(sources, (list, tuple)) else [sources]:
        if isinstance(source, (str, os.PathLike)):
            paths = list_images(str(source), recursive)
            if not paths and is_pattern(str(source)):
                raise FileNotFoundError(f"no file matches {source}")
            for path in paths:
                yield str(path), read_image(path)
        elif isinstance(source, np.ndarray):
            for image in source if source.ndim == 4 else [source]:
                yield None, array_to_bgr(image, color)
        elif hasattr(source, "convert") and hasattr(source, "size"):  # a PIL image: always RGB(A)/L/P
            rgb = np.asarray(source.convert("RGB"))
            yield getattr(source, "filename", None) or None, np.ascontiguousarray(rgb[:, :, ::-1])
        else:
            raise TypeError(
                f"cannot read a {type(source).__name__} as an image: give a path, a folder, a glob pattern, "
                "a PIL image or an array"
            )


def read_image(path: Path | str) -> np.ndarray:
    """The image (a file, or an image URL downloaded) decoded as training, evaluation and the demo decode it
    (`data.image_io`: truncated files refused, alpha on grey); a damaged file or a URL that serves no image
    is a ValueError naming it."""
    try:
        data = download(str(path)) if is_url(path) else None
    except (urllib.error.URLError, OSError) as err:  # refused, 404, timed out
        raise ValueError(f"cannot read image {path}: {err}") from None
    try:
        return image_io.read_image(str(path)) if data is None else image_io.decode_image(data, str(path))
    except image_io.CorruptImageError as err:
        raise ValueError(f"cannot read image {path}: {err}") from None


def array_to_bgr(image: np.ndarray, color: str) -> np.ndarray:
    """(H, W, 3) uint8 BGR from an (H, W, 3), (H, W, 4) or (H, W) uint8 array in `color` order."""
    if image.dtype != np.uint8:
        raise ValueError(f"images are uint8 0-255 arrays, got {image.dtype}")
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    if image.ndim != 3 or image.shape[2] not in (3, 4):
        raise ValueError(f"an image array is (H, W, 3), (H, W, 4) or (H, W), got {image.shape}")
    image = image[:, :, :3]
    return np.ascontiguousarray(image[:, :, ::-1] if color == "rgb" else image)
