"""ImageCache: resized uint8 training images stored once and memory-mapped by every process.

Layout: one raw file of N fixed slots (N, H, W, 3) uint8, image i resized keeping aspect into the
top-left of slot i, plus a JSON sidecar `<stem>.json` with the key, each image's resized (h, w) and a
decodable flag. The sidecar is written last, so it doubles as the completion marker: a killed build
leaves no sidecar, a truncated data file fails the size check, a changed image list or size changes the
key; all three are rebuilt, never read.

"ram" puts the file in /dev/shm (shared memory), "disk" in a cache directory. Either way every DDP
rank and loader worker maps the same pages read-only (np.memmap) — there is one copy per machine,
not one per process. One process builds under a file lock; the others wait for it and then map.

The room is checked before the build (for "ram": free /dev/shm, available RAM and, in a container, what
its cgroup memory limit leaves) and then reserved (posix_fallocate) before the first image is written:
a file that fills as it goes would end in a bus error when /dev/shm runs out halfway. A cache that does
not fit is one message saying what would (a smaller input size, fewer images, `--cache disk`); training
goes on uncached, or with `strict` stops with that line (CacheRoomError).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
from loguru import logger

from yolox_fast.data.augment import resize_keep_ratio
from yolox_fast.data.image_io import CorruptImageError
from yolox_fast.data.paths import datasets_root
from yolox_fast.utils.cgroup import cgroup_memory
from yolox_fast.utils.dist import get_rank
from yolox_fast.utils.progress import Progress

LAYOUT_VERSION = 1
SHM_DIR = Path("/dev/shm")
HEADROOM = 1 << 30  # leave 1 GiB of RAM/disk free beyond the cache itself
GIB = float(1 << 30)


class CacheRoomError(RuntimeError):
    """A cache that does not fit where it goes (with cache_strict): the message says what would."""


class ImageCache:
    """Read side of a completed cache: `get(i)` -> image i resized (h, w, 3) uint8 view, or None if the
    image could not be decoded when the cache was built. Pickles without its data (workers re-map)."""

    def __init__(self, path: Path, shape: tuple[int, int, int, int], sizes: np.ndarray, ok: np.ndarray):
        self.path = Path(path)
        self.shape = shape
        self.sizes = sizes  # (N, 2) resized h, w
        self.ok = ok  # (N,) bool
        self._array: np.memmap | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape))

    @property
    def array(self) -> np.memmap:
        if self._array is None:
            self._array = np.memmap(self.path, dtype=np.uint8, mode="r", shape=self.shape)
        return self._array

    def get(self, index: int) -> np.ndarray | None:
        if not self.ok[index]:
            return None
        h, w = self.sizes[index]
        return self.array[index, :h, :w]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_array"] = None  # never pickle the pages: the receiving process maps the file itself
        return state


def cache_key(name: str, files: list[str], size: tuple[int, int]) -> str:
    """Hash of (dataset name, image list with each file's size and mtime, slot size, layout version):
    an image rewritten in place (a regenerated set, an edited file) makes a new key."""
    stamps = []
    for path in files:
        try:
            st = os.stat(path)
            stamps.append((path, st.st_size, st.st_mtime_ns))
        except OSError:
            stamps.append((path, -1, -1))
    payload = json.dumps([LAYOUT_VERSION, name, list(size), stamps]).encode()
    return hashlib.sha1(payload).hexdigest()


def cache_paths(mode: str, name: str, size: tuple[int, int], key: str, cache_dir: str | None = None):
    """(data file, sidecar, lock file) for a cache."""
    if mode == "ram":
        folder, stem = SHM_DIR, f"yolox_fast-{name}-{size[0]}x{size[1]}-{key[:16]}"
    elif mode == "disk":
        folder = Path(cache_dir) if cache_dir else datasets_root() / ".cache"  # $YOLOX_DATADIR/.cache
        stem = f"{name}-{size[0]}x{size[1]}-{key[:16]}"
    else:
        raise ValueError(f"cache must be 'ram' or 'disk', got {mode!r}")
    return folder / f"{stem}.bin", folder / f"{stem}.json", folder / f".{stem}.lock"


def free_bytes(mode: str, folder: Path) -> tuple[int, str]:
    """Bytes a new cache may use in `folder` and a description of the limits, for the log. For "ram" the
    least of the free space of `folder`, the available RAM and the container's cgroup room (its pages
    are charged to the cgroup)."""
    disk = shutil.disk_usage(folder).free
    if mode != "ram":
        return disk, f"{disk / GIB:.1f} GiB free on the disk of {folder}"
    avail = psutil.virtual_memory().available
    room = min(disk, avail)
    where = f"{disk / GIB:.1f} GiB free in {folder}, {avail / GIB:.1f} GiB RAM available"
    cgroup = cgroup_memory()
    if cgroup is not None:
        room = min(room, cgroup.room)
        where += (
            f", {cgroup.room / GIB:.1f} GiB left under the container's memory limit of "
            f"{cgroup.limit / GIB:.1f} GiB ({cgroup.where})"
        )
    return room, where


def what_fits(room: int, shape: tuple[int, int, int, int]) -> str:
    """What a cache of `room` bytes (HEADROOM not yet taken off) holds instead of `shape` (N, H, W, 3):
    the input size at which all N images fit (sides in steps of 32, the aspect kept), and how many images
    fit at H x W."""
    n, h, w, _ = shape
    usable = max(room - HEADROOM, 0)
    scale = math.sqrt(usable / (n * h * w * 3)) if n else 0.0
    fit_h, fit_w = int(h * scale) // 32 * 32, int(w * scale) // 32 * 32
    images = usable // (h * w * 3)
    at_size = f"input_size ({fit_h}, {fit_w}) fits all {n} images, " if fit_h and fit_w else ""
    return (
        f"{at_size}{images} of the {n} images fit at {h}x{w}; or use --cache disk (the same file on disk, "
        "read through the page cache)"
    )


def open_cache(data: Path, sidecar: Path, key: str) -> ImageCache | None:
    """The cache at `data` if its sidecar says complete with this key and the file has the full size."""
    try:
        meta = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return None
    shape = tuple(meta.get("shape", ()))
    if meta.get("key") != key or len(shape) != 4:
        return None
    if not data.is_file() or data.stat().st_size != int(np.prod(shape)):
        return None
    return ImageCache(
        data, shape, np.array(meta["sizes"], dtype=np.int64).reshape(-1, 2), np.array(meta["ok"], dtype=bool)
    )


def build_cache(
    dataset, mode: str, cache_dir: str | None = None, strict: bool = False, num_threads: int | None = None
) -> ImageCache | None:
    """Map (building it first if needed) the cache of `dataset` (a DetectionDataset) at its img_size.

    Returns None — training continues uncached, after a warning with the numbers — when there is
    not enough room; with `strict` that raises RuntimeError instead.
    """
    size = tuple(dataset.img_size)
    files = dataset.image_files()
    key = cache_key(dataset.name, files, size)
    data, sidecar, lock_path = cache_paths(mode, dataset.name, size, key, cache_dir)
    cache = open_cache(data, sidecar, key)
    if cache is not None:
        logger.info(f"{mode} cache: mapped {data} ({cache.nbytes / GIB:.2f} GiB, {len(files)} images)")
        return cache
    if mode == "ram" and not SHM_DIR.is_dir():
        msg = f"ram cache needs shared memory at {SHM_DIR}, which this machine does not have"
        if strict:
            raise RuntimeError(msg)
        logger.warning(f"{msg}; continuing WITHOUT a cache (try cache='disk')")
        return None
    data.parent.mkdir(parents=True, exist_ok=True)
    shape = (len(files), size[0], size[1], 3)
    # checked before the lock file is made, so a refused cache leaves nothing behind in /dev/shm
    if not _fits(mode, data.parent, shape, strict):
        return None
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per machine; the others wait here
        cache = open_cache(data, sidecar, key)
        if cache is None:
            if not _fits(mode, data.parent, shape, strict):  # another process may have taken the room
                return None
            try:
                cache = _build(dataset, mode, data, sidecar, key, shape, num_threads)
            except CacheRoomError as err:  # the reservation was refused: nothing was written
                if strict:
                    raise
                logger.warning(f"{err}; continuing WITHOUT a cache")
                return None
            except OSError as err:  # filled up all the same (a file system that cannot reserve)
                if err.errno != errno.ENOSPC:
                    raise
                _filled_up(mode, data, sidecar, strict, err)
                return None
    logger.info(f"{mode} cache: mapped {data} ({cache.nbytes / GIB:.2f} GiB, {len(files)} images)")
    return cache


def _fits(mode: str, folder: Path, shape: tuple[int, int, int, int], strict: bool) -> bool:
    """Whether a cache of `shape` fits in `folder` with HEADROOM to spare; if not, a warning with the
    numbers (RuntimeError when `strict`)."""
    need = int(np.prod(shape))
    room, where = free_bytes(mode, folder)
    if need + HEADROOM <= room:
        return True
    msg = (
        f"{mode} cache of {shape[0]} images at {shape[1]}x{shape[2]} needs {need / GIB:.2f} GiB "
        f"(+{HEADROOM / GIB:.0f} GiB headroom) but only {where}: {what_fits(room, shape)}"
    )
    if strict:
        raise CacheRoomError(msg)
    logger.warning(f"{msg}; continuing WITHOUT a cache")
    return False


def _filled_up(mode: str, data: Path, sidecar: Path, strict: bool, err: OSError) -> None:
    """The folder filled up while the cache was written (another process took the room after `_fits`):
    remove what this build wrote, then say so (OSError when `strict`, else a warning and no cache)."""
    for partial in (
        data,
        sidecar,
        *data.parent.glob(f"{data.name}.tmp-*"),
        *data.parent.glob(f"{sidecar.name}.tmp-*"),
    ):
        partial.unlink(missing_ok=True)
    msg = (
        f"{mode} cache: {data.parent} filled up while {data.name} was written ({err.strerror or err}); the "
        "partial file is removed"
    )
    if strict:
        raise CacheRoomError(msg) from err
    logger.warning(f"{msg}; continuing WITHOUT a cache")


def _reserve(f, mode: str, shape: tuple[int, int, int, int]) -> None:
    """Allocate the whole data file now, so that running out of room is this one error at the start and
    never a bus error in the middle of the build (a write to a sparse file's page that /dev/shm cannot
    back). CacheRoomError when the file system refuses the room."""
    need = int(np.prod(shape))
    try:
        os.posix_fallocate(f.fileno(), 0, need)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENOMEM):
            # a file system that cannot preallocate: the file stays sparse, as it always was
            logger.warning(f"cannot reserve the {mode} cache in advance ({err.strerror}): built sparse")
            f.truncate(need)
            return
        folder = Path(f.name).parent
        room, where = free_bytes(mode, folder)
        raise CacheRoomError(
            f"{mode} cache of {shape[0]} images at {shape[1]}x{shape[2]} needs {need / GIB:.2f} GiB, and "
            f"{folder} could not reserve it ({err.strerror}; {where}): {what_fits(room, shape)}"
        ) from None


def _report_leftovers(data: Path, name: str) -> None:
    """Remove temp files of killed builds of this cache (we hold its lock, so none is in progress) and
    point at complete caches of the same dataset under other keys: in /dev/shm they hold RAM."""
    for stale in data.parent.glob(f"{data.name}.tmp-*"):
        stale.unlink(missing_ok=True)
    prefix = data.name.rsplit("-", 2)[0]  # <stem without size and key>
    others = [p for p in data.parent.glob(f"{prefix}-*.bin") if p != data]
    if others:
        total = sum(p.stat().st_size for p in others) / GIB
        logger.warning(
            f"other caches of dataset {name} ({total:.2f} GiB) are in {data.parent}: "
            f"{', '.join(p.name for p in others)}; delete them if no run uses them"
        )


def _build(dataset, mode: str, data: Path, sidecar: Path, key: str, shape, num_threads) -> ImageCache:
    sidecar.unlink(missing_ok=True)  # from here on the old cache is invalid, even if we are killed
    _report_leftovers(data, dataset.name)
    tmp = data.with_name(f"{data.name}.tmp-{os.getpid()}")
    n = shape[0]
    sizes = np.zeros((n, 2), dtype=np.int64)
    ok = np.ones(n, dtype=bool)
    try:
        with open(tmp, "wb") as f:
            _reserve(f, mode, shape)
        slots = np.memmap(tmp, dtype=np.uint8, mode="r+", shape=shape)

        def fill(i: int) -> None:
            try:
                img, _ = resize_keep_ratio(dataset.load_image(i), shape[1:3])
            except CorruptImageError as err:
                dataset.damaged.mark(i, f"{err} (not cached)")
                ok[i] = False
                return
            slots[i, : img.shape[0], : img.shape[1]] = img
            sizes[i] = img.shape[:2]

        threads = num_threads or min(8, os.cpu_count() or 1)
        progress = Progress(f"building cache {data.name}", n, enabled=get_rank() == 0)
        pool = ThreadPoolExecutor(threads)
        try:
            for _ in pool.map(fill, range(n)):
                progress.step()
        finally:  # on an error, drop the queued images instead of decoding the whole set first
            pool.shutdown(wait=True, cancel_futures=True)
        slots.flush()
        os.replace(tmp, data)
    finally:
        tmp.unlink(missing_ok=True)
    meta = {
        "key": key,
        "version": LAYOUT_VERSION,
        "shape": list(shape),
        "sizes": sizes.tolist(),
        "ok": ok.tolist(),
        "images": n,
    }
    side_tmp = sidecar.with_name(f"{sidecar.name}.tmp-{os.getpid()}")
    side_tmp.write_text(json.dumps(meta))
    os.replace(side_tmp, sidecar)  # the completion marker: written last, atomically
    return ImageCache(data, shape, sizes, ok)
