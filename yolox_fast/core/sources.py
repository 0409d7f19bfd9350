"""What the demo reads: images from files, folders, globs and URLs; frames from video files, stream URLs
(rtsp://, rtmp://, http(s)://, as OpenCV's FFmpeg reads them) and cameras, a dropped live stream reopened."""

from __future__ import annotations

import glob
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import cv2
import numpy as np
from loguru import logger

from yolox_fast.data import image_io

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
STREAM_SCHEMES = ("rtsp", "rtmp", "http", "https")
_GLOB_CHARS = "*?["
URL_TIMEOUT_S = 10.0


def is_url(path: str | Path) -> bool:
    """True for a network address the demo can read (rtsp://, rtmp://, http(s)://)."""
    return urlparse(str(path)).scheme.lower() in STREAM_SCHEMES


def list_images(path: str, recursive: bool = False) -> list[Path | str]:
    """The images `path` names: an image URL (itself), a glob (`photos/*.jpg`, `data/**/*.png`; sorted), a
    file (itself), or a folder: its own images, sorted, and with `recursive` those of its subfolders too.
    Without `recursive`, images left in subfolders are counted in one log line that names the flag."""
    if is_url(path):
        return [path]
    if is_pattern(path):
        found = sorted(Path(p) for p in glob.glob(path, recursive=True))
        return [p for p in found if _is_image(p)]
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"no such image file or folder: {path}")
    if recursive:
        return sorted(f for f in p.rglob("*") if _is_image(f))
    entries = list(p.iterdir())  # listed once: the folder's own images, and the subfolders for the hint
    below = sum(1 for d in entries if d.is_dir() for f in d.rglob("*") if _is_image(f))
    if below:
        logger.info(
            f"{path}: {below} images in its subfolders not read (the folder's own only): "
            "--recursive (recursive=True in Python) reads them too"
        )
    return sorted(f for f in entries if _is_image(f))


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTS and path.is_file()


def is_pattern(path: str) -> bool:
    """A glob pattern: glob characters in a path that does not exist as written (`photo[1].jpg` may)."""
    return any(c in path for c in _GLOB_CHARS) and not Path(path).exists()


def image_base(path: str) -> Path:
    """The folder image names are given relative to: the folder itself, a file's or glob's folder."""
    if is_url(path):
        return Path()
    if is_pattern(path):
        fixed = [part for part in Path(path).parts]
        while fixed and any(c in fixed[-1] for c in _GLOB_CHARS):
            fixed.pop()
        return Path(*fixed) if fixed else Path()
    return Path(path) if Path(path).is_dir() else Path(path).parent


def image_name(image: Path | str, base: Path) -> str:
    """How an image is named in the outputs: its path under `base`, or a URL's file name."""
    if isinstance(image, str):
        return PurePosixPath(urlparse(image).path).name or "image.jpg"
    return str(image.relative_to(base))


def download(url: str) -> bytes:
    """The bytes an image URL serves (urllib's errors, URLError and OSError, are the caller's)."""
    with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response:
        return response.read()


def read_image(image: Path | str) -> np.ndarray | None:
    """BGR uint8 (H, W, 3) of a file or an image URL, decoded as training and evaluation decode them
    (`data.image_io`: truncated files refused, alpha on grey); None (and one warning naming it) when it
    cannot be read or decoded whole."""
    try:
        if isinstance(image, Path):
            return image_io.read_image(str(image))
        return image_io.decode_image(download(image), image)
    except (image_io.CorruptImageError, urllib.error.URLError, OSError, ValueError) as err:
        logger.warning(f"cannot read image {image}: {err}; skipped")
        return None


class VideoSource:
    """Frames of a video file, a stream URL or a camera id, one `read` at a time (None at the end).

    A live stream (a URL without a frame count: rtsp, an MJPEG camera) that stops delivering frames is
    reopened up to `reconnect_tries` times, `reconnect_wait_s` apart, each attempt logged; a video file,
    local or served over HTTP, ends at its last frame. Opening errors are one line that says what to check.
    """

    def __init__(self, source: str | int, reconnect_tries: int = 5, reconnect_wait_s: float = 1.0) -> None:
        self.source = source
        self.reconnect_tries = reconnect_tries
        self.reconnect_wait_s = reconnect_wait_s
        self.reconnects = 0
        url = isinstance(source, str) and is_url(source)
        if isinstance(source, str) and not url and not Path(source).exists():
            raise FileNotFoundError(f"no such video file: {source}")
        self._cap = cv2.VideoCapture(source)
        if not self._cap.isOpened():
            if url:
                raise ConnectionError(
                    f"cannot open stream {source}: check the address, that the server is up and that it "
                    "serves video OpenCV's FFmpeg reads"
                )
            if isinstance(source, str):
                raise ValueError(
                    f"{source} exists but is not a video OpenCV can read (an image, text, or an "
                    "unsupported codec?); use `image --path` for pictures"
                )
            raise FileNotFoundError(f"cannot open camera {source}: is it connected and not in use?")
        # FFmpeg reports no frame count (0 or negative) for a live stream; a served file has one
        self.live = url and self._cap.get(cv2.CAP_PROP_FRAME_COUNT) <= 0
        self.fps = self._cap.get(cv2.CAP_PROP_FPS) or 30.0

    def read(self) -> np.ndarray | None:
        """The next frame (BGR uint8), or None when the video ends or a live stream cannot be reopened."""
        ok, frame = self._cap.read()
        if ok:
            return frame
        if not self.live:
            return None
        for attempt in range(1, self.reconnect_tries + 1):
            logger.warning(
                f"stream {self.source} dropped: reconnecting ({attempt}/{self.reconnect_tries}) in "
                f"{self.reconnect_wait_s:g} s"
            )
            time.sleep(self.reconnect_wait_s)
            self._cap.release()
            self._cap = cv2.VideoCapture(self.source)
            ok, frame = self._cap.read() if self._cap.isOpened() else (False, None)
            if ok:
                self.reconnects += 1
                return frame
        logger.warning(f"stream {self.source} lost: no frame after {self.reconnect_tries} reconnect attempts")
        return None

    def release(self) -> None:
        self._cap.release()
