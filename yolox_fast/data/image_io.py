"""read_image: the one place an image file becomes pixels, and the rule for what counts as damaged.

Training, evaluation, the image cache, the demo and the dataset checker all decode through `read_image`,
so they agree on what an image is (docs/datasets.md, "Damaged and inconsistent data"):

- a file of 0 bytes, a JPEG whose last scan has no end-of-image marker (FF D9) after it, a PNG without
  its IEND chunk, or bytes no decoder reads is a CorruptImageError naming the file and the reason. A
  truncated JPEG is found here, before decoding: libjpeg would fill the missing rows grey and print only
  a bare "Premature end of JPEG file" line without the file's name;
- an image of more than MAX_IMAGE_PIXELS pixels by its header (a decompression bomb, or a scan no
  detector should be fed whole) is refused with its size, before a byte of it is decoded;
- an alpha channel (PNG, WebP) is composited over ALPHA_BACKGROUND, the letterbox grey: what is
  transparent reads as the padding the model already knows as "no image", never as the colour hidden
  under it (such an image is read as stored: OpenCV's alpha-keeping decode ignores an EXIF orientation,
  which PNG and WebP files rarely carry).

What stays out of reach through OpenCV: a JPEG that ends whole but has damaged bytes inside decodes with
libjpeg's "Corrupt JPEG data" line and no result to test, and a PNG whose data fails its checksum prints
libpng's error line before `read_image` names the file.

`header_sizes` and `image_size` read sizes from headers only (a fraction of a millisecond each).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator

import cv2
import imagesize
import numpy as np
from PIL import Image

from yolox_fast.data.augment import PAD_VALUE

MAX_IMAGE_PIXELS = 16384 * 16384  # 268 M pixels, 0.8 GB decoded: far above any photo, below any bomb
ALPHA_BACKGROUND = (PAD_VALUE, PAD_VALUE, PAD_VALUE)  # BGR
EXIF_ORIENTATION = 0x0112
JPEG_START, JPEG_SCAN, JPEG_END = b"\xff\xd8", b"\xff\xda", b"\xff\xd9"
PNG_START = b"\x89PNG\r\n\x1a\n"
HEADER_THREADS = 8  # image headers are read in parallel: the time is file-system latency, not CPU
PNG_TAIL = 1 << 16  # IEND is the last chunk: look for it in the file's last 64 KiB (trailing junk allowed)
HEADER_BYTES = 1 << 16  # enough of a file to hold the chunks that announce transparency


class CorruptImageError(RuntimeError):
    """An image file exists but cannot be used whole: `reason` is one of "empty", "truncated",
    "undecodable", "too large"."""

    def __init__(self, message: str, reason: str = "undecodable") -> None:
        super().__init__(message)
        self.reason = reason


def read_image(path: str, ignore_orientation: bool = False) -> np.ndarray:
    """The image at `path` as BGR uint8 (H, W, 3), turned upright by its EXIF orientation unless
    `ignore_orientation`; CorruptImageError (see the module docstring), FileNotFoundError if absent."""
    with open(path, "rb") as f:
        data = f.read()
    return decode_image(data, path, ignore_orientation)


def decode_image(data: bytes, path: str, ignore_orientation: bool = False) -> np.ndarray:
    """`read_image` of a file's bytes already in memory (a download); `path` names it in errors."""
    if not data:
        raise CorruptImageError(f"{path}: the file is empty (0 bytes)", "empty")
    _refuse_huge(path, data)
    missing = _missing_end(data)
    if missing:
        raise CorruptImageError(f"{path}: truncated ({len(data)} bytes, {missing})", "truncated")
    buffer = np.frombuffer(data, dtype=np.uint8)
    flags = cv2.IMREAD_COLOR | (cv2.IMREAD_IGNORE_ORIENTATION if ignore_orientation else 0)
    img = _decode_with_alpha(buffer) if _may_have_alpha(data) else None
    if img is None:
        img = cv2.imdecode(buffer, flags)
    if img is None:
        raise CorruptImageError(f"{path}: not an image any decoder reads ({len(data)} bytes)")
    return img


def _refuse_huge(path: str, data: bytes) -> None:
    try:
        width, height = imagesize.get(io.BytesIO(data), exif_rotation=False)  # pixels, not orientation
    except (ValueError, OSError):  # a header imagesize cannot parse: the decoder decides
        return
    if width > 0 and height > 0 and width * height > MAX_IMAGE_PIXELS:
        raise CorruptImageError(
            f"{path}: {width}x{height} pixels, more than the {MAX_IMAGE_PIXELS} pixels an image may have "
            "(a decompression bomb?); refused before decoding",
            "too large",
        )


def _missing_end(data: bytes) -> str | None:
    """What a JPEG or PNG lacks at its end (a cut download or copy), None if it ends whole."""
    if data.startswith(JPEG_START):
        end = data.rfind(JPEG_END)
        # entropy-coded data never holds FF D9 or FF DA, so a cut scan is a scan after the last marker
        if end < 0 or data.find(JPEG_SCAN, end) >= 0:
            return "no JPEG end-of-image marker after its last scan"
    elif data.startswith(PNG_START) and data.rfind(b"IEND", max(0, len(data) - PNG_TAIL)) < 0:
        return "no PNG IEND chunk"
    return None


def _may_have_alpha(data: bytes) -> bool:
    """Whether the header announces transparency: a PNG of colour type 4 or 6 or with a tRNS chunk, a
    WebP in the lossless or extended (alpha flag) format."""
    if data.startswith(PNG_START):
        header_end = data.find(b"IDAT")
        return len(data) > 25 and (data[25] in (4, 6) or data.find(b"tRNS", 0, header_end) >= 0)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        chunk = data[12:16]
        return chunk == b"VP8L" or (chunk == b"VP8X" and len(data) > 20 and bool(data[20] & 0x10))
    return False


def has_alpha(path: str) -> bool:
    """Whether the image at `path` announces transparency in its header (`read_image` composites it)."""
    with open(path, "rb") as f:
        return _may_have_alpha(f.read(HEADER_BYTES))


def _decode_with_alpha(buffer: np.ndarray) -> np.ndarray | None:
    """BGR (H, W, 3) uint8 of an image with alpha, composited over ALPHA_BACKGROUND; None when the
    decoded image has no alpha after all (the caller decodes it as colour)."""
    img = cv2.imdecode(buffer, cv2.IMREAD_UNCHANGED)
    if img is None or img.ndim != 3 or img.shape[2] not in (2, 4):
        return None
    if img.dtype == np.uint16:
        img = (img.astype(np.float32) / 257.0).round().astype(np.uint8)
    alpha = img[..., -1:].astype(np.float32) / 255.0  # (H, W, 1)
    colour = img[..., :1].repeat(3, axis=2) if img.shape[2] == 2 else img[..., :3]  # (H, W, 3) BGR
    background = np.array(ALPHA_BACKGROUND, dtype=np.float32)
    return (colour.astype(np.float32) * alpha + background * (1.0 - alpha)).round().astype(np.uint8)


def _pil_open(path: str) -> Image.Image:
    """Pillow's lazy image (header only), without Pillow's own size warning: MAX_IMAGE_PIXELS is ours."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(path)


def header_sizes(path: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """((height, width) as `read_image` decodes it, EXIF rotation applied; (height, width) as stored),
    from the header only (a fraction of a millisecond, where decoding takes several). OSError or
    ValueError if it cannot be read."""
    try:
        with _pil_open(path) as img:
            width, height = img.size
            orientation = img.getexif().get(EXIF_ORIENTATION, 1)
    except Image.DecompressionBombError:  # too large for Pillow: its size still says what it is
        width, height = imagesize.get(path)
        orientation = 1
    stored = (height, width)
    if orientation in (5, 6, 7, 8):  # rotated by 90 or 270 degrees: OpenCV returns it upright
        return (width, height), stored
    return stored, stored


def image_size(path: str) -> tuple[int, int]:
    """(height, width) of an image as `read_image` decodes it, from its header (see `header_sizes`)."""
    return header_sizes(path)[0]


@contextlib.contextmanager
def native_stderr_lines() -> Iterator[list[str]]:
    """Keep what C libraries (libjpeg, libpng, OpenCV) write to file descriptor 2 inside the block off
    the terminal: the list it yields holds those lines once the block ends, for the caller to say what
    they were about. Only for blocks that log nothing themselves: Python's own stderr writes land there
    too."""
    sys.stderr.flush()
    saved = os.dup(2)
    lines: list[str] = []
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(line for line in sink.read().decode(errors="replace").splitlines() if line.strip())
