"""Where a split's DatasetIndex is kept between runs: one folder per annotation file and machine.

The first process to read an annotation file parses it, saves its index under a name keyed by the file's
absolute path, size and modification time (and the reader's parameters), and every process after it, on
this or any later run, memory-maps that folder instead of parsing: 8 ranks with 4 loader workers each
share one copy of the index in the page cache. One process builds under a file lock while the others
wait; the index is written to a temporary folder renamed into place when complete (a rename is atomic),
so a reader never sees half an index, and a killed build leaves only a temporary folder behind.

The folder: the `folder` argument (the exp's `cache_dir`, then `<cache_dir>/index`), else
`$YOLOX_FAST_CACHE/index`, else `$XDG_CACHE_HOME/yolox_fast/index` (`~/.cache/yolox_fast/index`). Where
it cannot be written the index is built in memory, with one warning.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from yolox_fast.data.datasets.index import DatasetIndex

# bump when the arrays a reader stores change meaning: old indexes are then never read
INDEX_VERSION = 1

_warned_unwritable: set[str] = set()


def index_root(folder: str | None = None) -> Path:
    """The folder that holds the saved indexes (see the module docstring)."""
    if folder:
        return Path(folder).expanduser() / "index"
    if os.environ.get("YOLOX_FAST_CACHE"):
        return Path(os.environ["YOLOX_FAST_CACHE"]).expanduser() / "index"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "yolox_fast" / "index"


def source_key(source: str, params: dict[str, Any]) -> str:
    """sha1 of (INDEX_VERSION, the source file's absolute path, size and mtime, the reader's params): an
    edited or replaced annotation file gets a new key, so a stale index is never read."""
    st = os.stat(source)
    payload = [INDEX_VERSION, os.path.abspath(source), st.st_size, st.st_mtime_ns, params]
    return hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _open_complete(target: Path) -> DatasetIndex | None:
    if not (target / "meta.json").is_file():
        return None
    try:
        return DatasetIndex.load(target)
    except (OSError, ValueError) as err:  # damaged by hand or by a full disk: parse again, in memory
        logger.warning(f"dataset index {target} cannot be read ({err}): the annotations are parsed again")
        return None


def _remove_older(root: Path, target: Path, source: dict[str, Any]) -> None:
    """Delete the saved indexes of earlier versions of `source` (its path and the reader's params): an
    edited annotation file gets a new key, and its old indexes would pile up. A process still mapping one
    keeps its pages until it ends."""
    stem = target.name.rsplit("-", 1)[0]
    for other in root.glob(f"{stem}-*"):
        if other == target or not other.is_dir() or ".tmp-" in other.name:
            continue
        try:
            meta = json.loads((other / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("source") == source:
            shutil.rmtree(other, ignore_errors=True)


def stored_index(
    source: str, params: dict[str, Any], build: Callable[[], DatasetIndex], folder: str | None = None
) -> tuple[DatasetIndex, bool]:
    """(the index of `source`, whether it was read from a saved copy): the saved one when there is one
    for this key, else `build()`'s, saved for the next process and returned memory-mapped."""
    root = index_root(folder)
    key = source_key(source, params)
    target = root / f"{Path(source).stem}-{key[:16]}"
    index = _open_complete(target)
    if index is not None:
        logger.info(f"{source}: read its saved index {target} (no parse)")
        return index, True
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{target.name}.lock", "w")  # noqa: SIM115 (held across the build below)
    except OSError as err:
        if str(root) not in _warned_unwritable:
            _warned_unwritable.add(str(root))
            logger.warning(
                f"cannot write dataset indexes to {root} ({err}): every process parses its annotation files "
                "itself; set the exp's cache_dir (or $YOLOX_FAST_CACHE) to a writable folder"
            )
        return build(), False
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per machine; the other processes wait here
        index = _open_complete(target)
        if index is not None:
            logger.info(f"{source}: read the index {target} another process saved (no parse)")
            return index, True
        start = time.perf_counter()
        built = build()
        seconds = time.perf_counter() - start
        built.meta["source"] = {"path": os.path.abspath(source), "params": params}
        tmp = root / f"{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            built.save(tmp)
            os.rename(tmp, target)
        except OSError as err:  # a full disk, or another machine on a shared folder renamed first
            shutil.rmtree(tmp, ignore_errors=True)
            index = _open_complete(target)
            if index is None:
                logger.warning(f"cannot save the index of {source} to {target} ({err}): kept in memory")
                return built, False
            return index, False
    logger.info(f"{source}: parsed in {seconds:.1f} s; its index is saved as {target} for the next start")
    _remove_older(root, target, built.meta["source"])
    # the mapped copy, not the built one: its pages are shared with every other process of the machine
    return DatasetIndex.load(target), False
