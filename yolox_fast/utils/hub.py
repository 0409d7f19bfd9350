"""Pretrained weights by name: `-c yolox-s` / `YOLOX("yolox-s")` fetch official YOLOX's release file once into
a cache folder, check its SHA-256 and give its path.

The files are official YOLOX's COCO weights of release 0.1.1rc0 (what its model zoo links to). Megvii
publishes no checksums. For yolox-tiny, -s, -m, -l and -x the SHA-256 below is the one that two independent
public records of downloads of those files agree on; we could not download them here to confirm. For
yolox-nano (one record only) the first download is trusted: its SHA-256 is written beside the file
(`<file>.sha256`) and every later use checks the file against it, so a cache damaged later is caught (trust on
first use).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from loguru import logger

RELEASE_URL = "https://github.com/Megvii-BaseDetection/YOLOX/releases/download/0.1.1rc0"
MIRROR_ENV = "YOLOX_FAST_WEIGHTS_URL"  # another base URL holding the same file names (a mirror, a proxy)
HOME_ENV = "YOLOX_FAST_HOME"

# zoo name -> (release file name, SHA-256 or None: trusted on first download)
WEIGHTS = {
    "yolox-nano": ("yolox_nano.pth", None),
    "yolox-tiny": ("yolox_tiny.pth", "9de513de589ac98bb92d3bca53b5af7b9acfa9b0bacb831f7999d0f7afaee8f0"),
    "yolox-s": ("yolox_s.pth", "f55ded7181e1b0c13285c56e7790b8f0e8f8db590fe4edb37f0b7f345c913a30"),
    "yolox-m": ("yolox_m.pth", "60076992b32da82951c90cfa7bd6ab70eba9eda243e08b940a396f60ac2d19b6"),
    "yolox-l": ("yolox_l.pth", "1e6b7fa6240375370b2a8a8eab9066b3cdd43fd1d0bfa8d2027fd3a51def2917"),
    "yolox-x": ("yolox_x.pth", "5652330b6ae860043f091b8f550a60c10e1129f416edfdb65c259be6caf355cf"),
}
CHUNK = 1 << 20  # bytes read and hashed at a time


class WeightsDownloadError(RuntimeError):
    """Pretrained weights could not be fetched or failed their checksum (the message says what to do)."""


def weights_key(name: str) -> str | None:
    """The WEIGHTS key `name` means (`yolox-s`, `yolox_s`, `YOLOX-S`), or None when it names no weights."""
    key = str(name).strip().lower().replace("_", "-")
    return key if key in WEIGHTS else None


def cache_dir() -> Path:
    """$YOLOX_FAST_HOME/weights, else yolox_fast/ in torch's hub folder ($TORCH_HOME/hub or
    ~/.cache/torch/hub)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser() / "weights"
    import torch

    return Path(torch.hub.get_dir()) / "yolox_fast"


def weights_url(name: str) -> str:
    """Where the weights of zoo name `name` come from ($YOLOX_FAST_WEIGHTS_URL replaces the base URL)."""
    base = os.environ.get(MIRROR_ENV) or RELEASE_URL
    return f"{base.rstrip('/')}/{WEIGHTS[weights_key(name)][0]}"


def fetch_weights(name: str) -> Path:
    """The cached file of zoo name `name`, downloaded on first use (never twice) and checked against its
    SHA-256: the recorded one, else the one stored at its first download."""
    key = weights_key(name)
    if key is None:
        raise ValueError(f"no pretrained weights named {name!r}; known: {', '.join(WEIGHTS)}")
    file_name, expected = WEIGHTS[key]
    path = cache_dir() / file_name
    record = path.with_name(path.name + ".sha256")
    if path.is_file():  # downloaded before, or put there by hand
        trusted = expected or (record.read_text().strip() if record.is_file() else None)
        if trusted is None:
            record.write_text(file_sha256(path) + "\n")
            logger.info(f"{path.name}: found in the cache; its SHA-256 recorded (trusted from now on)")
        elif file_sha256(path) != trusted:
            raise WeightsDownloadError(
                f"{path} does not match its SHA-256 ({trusted}): the cached file was changed or damaged; "
                "delete it to download it again"
            )
        return path
    url = weights_url(key)
    logger.info(f"downloading {key} weights: {url} -> {path}")
    digest = download(url, path, expected, by_hand=path)
    if expected is None:
        record.write_text(digest + "\n")
        logger.info(f"{path.name}: SHA-256 {digest} recorded (first download, trusted from now on)")
    return path


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest()


def download(url: str, dest: Path, sha256: str | None = None, by_hand: Path | None = None) -> str:
    """Download `url` to `dest` atomically: the bytes go to a temporary file beside it, hashed as they come,
    and are renamed to `dest` only when complete and, with `sha256`, matching it; a failed or refused download
    leaves nothing behind. Returns the SHA-256. WeightsDownloadError names the URL and where to put the file
    by hand (`by_hand`, default `dest`)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    sha = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            for chunk in iter(lambda: response.read(CHUNK), b""):
                sha.update(chunk)
                out.write(chunk)
        digest = sha.hexdigest()
        if sha256 is not None and digest != sha256:
            raise WeightsDownloadError(
                f"{url}: SHA-256 {digest} is not the expected {sha256} (a damaged download or a changed "
                f"file); not kept. Try again, or put a good copy at {by_hand or dest}"
            )
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise WeightsDownloadError(
            f"cannot download {url} ({reason}); offline, download it by hand and put it at {by_hand or dest}"
        ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return digest
