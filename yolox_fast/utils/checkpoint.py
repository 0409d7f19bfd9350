"""Checkpoint I/O: safe loading (weights_only), tolerant or strict weight loading, atomic saving.

A checkpoint is either a raw state_dict or a dict with the state_dict under "model" (official YOLOX
and our trainer), plus optional plain-data entries (epoch, optimizer state, best AP, ...).
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger
from tabulate import tabulate
from torch import nn

__all__ = [
    "load_checkpoint",
    "load_model_weights",
    "load_resume_checkpoint",
    "model_state_dict",
    "restart_count",
    "resume_checkpoint_path",
    "save_checkpoint",
]


class CheckpointError(RuntimeError):
    """A checkpoint the user gave cannot be used: truncated, corrupt, refused by weights-only loading, or
    not the model's (the message says which and what to do)."""


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint with `torch.load(weights_only=True)`: tensors and plain data only, no pickled code.

    Raises FileNotFoundError for a missing file and CheckpointError naming the file when it is
    truncated, corrupt or holds objects that weights_only loading refuses.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals(_numpy_scalar_globals()):
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # garbage bytes read as pickle opcodes also fail inside the weights-only unpickler
        if "weights only" not in str(e).lower() or "Unsupported operand" in str(e):
            raise _corrupt(path, e) from e
        reason = next(
            (ln.strip() for ln in str(e).splitlines() if "Unsupported" in ln), str(e).splitlines()[0]
        )
        raise CheckpointError(
            f"checkpoint {path} holds objects that weights_only loading refuses (pickled classes or code); "
            f"re-save it with plain tensors, numbers, strings, lists and dicts only. torch said: {reason}"
        ) from e
    except Exception as e:  # torch reports damaged files as RuntimeError, EOFError, KeyError, ... by format
        raise _corrupt(path, e) from e
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(ckpt).__name__}, expected a dict")
    return ckpt


def load_resume_checkpoint(
    path: str | os.PathLike, map_location: Any = "cpu", fall_back: bool = False
) -> tuple[Path, dict[str, Any]]:
    """(the path resumed from, its checkpoint) for a resume from `path`.

    With `fall_back` (`path` is the run's own latest_ckpt.pth, not one the user named) a damaged
    `path` is named in a warning and the run continues from the newest readable checkpoint of its
    folder that can resume it (epoch_N, last_mosaic_epoch or best: the one furthest in training, of
    equals the newest);
    when there is none, the CheckpointError says so in one line.
    """
    path = Path(path)
    try:
        return path, load_checkpoint(path, map_location)
    except CheckpointError as err:
        if not fall_back:
            raise
        damaged = err
    found = []
    for other in sorted(path.parent.glob("*_ckpt.pth")):
        if other == path:
            continue
        try:
            ckpt = load_checkpoint(other, map_location)
        except CheckpointError:
            continue
        if "optimizer" in ckpt and "start_epoch" in ckpt:
            found.append(
                ((int(ckpt["start_epoch"]), int(ckpt.get("iter", 0))), other.stat().st_mtime, other, ckpt)
            )
    if not found:
        raise CheckpointError(f"{damaged}; no other checkpoint in {path.parent} can resume the run") from None
    (epoch, it), _, other, ckpt = max(found, key=lambda f: f[:2])  # furthest; of equals, the newest
    logger.warning(
        f"{damaged}; resuming instead from {other}, the checkpoint of {path.parent} furthest in training "
        f"(epoch {epoch + 1}, iteration {it})"
    )
    return other, ckpt


def _corrupt(path: Path, error: Exception) -> CheckpointError:
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    return CheckpointError(
        f"cannot read checkpoint {path} ({path.stat().st_size} bytes): the file is truncated or corrupt "
        f"(an interrupted download, copy or save?). torch said: {detail}"
    )


def model_state_dict(ckpt: Mapping[str, Any]) -> Mapping[str, torch.Tensor]:
    """The model weights of a checkpoint: ckpt["model"] if present, else the checkpoint itself.

    A "module." prefix left by saving a DistributedDataParallel wrapper is removed.
    """
    state = ckpt["model"] if isinstance(ckpt.get("model"), Mapping) else ckpt
    if state and all(k.startswith("module.") for k in state):
        state = OrderedDict((k[len("module.") :], v) for k, v in state.items())
    return state


def _shape(t: Any) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else "-"


def _class_count_hint(mismatched: list[str], state: Mapping[str, torch.Tensor], model_state: Mapping) -> str:
    """'checkpoint was trained for N classes, exp has M' when the classifier is what differs."""
    for key in mismatched:
        if ".cls_preds." in key and key.endswith(".weight"):
            trained, wanted = state[key].shape[0], model_state[key].shape[0]
            return f"checkpoint was trained for {trained} classes, exp has {wanted}; "
    return ""


def load_model_weights(model: nn.Module, state_dict: Mapping[str, Any], strict: bool = False) -> list[str]:
    """Copy weights into `model`; returns the model keys left at their current values.

    `state_dict` may be a raw state_dict or a full checkpoint (see `model_state_dict`).
    strict=False (fine-tuning): tensors whose shape differs (e.g. cls_preds for another number of
    classes) and keys present on one side only are skipped, with a warning table listing them.
    strict=True (eval, demo, resume): any such difference raises a CheckpointError naming the tensors.
    """
    state = model_state_dict(state_dict)
    model_state = model.state_dict()
    mismatched = [k for k in model_state if k in state and state[k].shape != model_state[k].shape]
    missing = [k for k in model_state if k not in state]
    unexpected = [k for k in state if k not in model_state]
    rows = (
        [(k, _shape(state[k]), _shape(model_state[k]), "shape mismatch") for k in mismatched]
        + [(k, "-", _shape(model_state[k]), "missing in checkpoint") for k in missing]
        + [(k, _shape(state[k]), "-", "not in model") for k in unexpected]
    )
    table = tabulate(rows, headers=["name", "checkpoint shape", "model shape", "problem"]) if rows else ""

    if strict and rows:
        raise CheckpointError(
            f"{_class_count_hint(mismatched, state, model_state)}checkpoint does not match the model "
            f"({len(mismatched)} shape mismatches, {len(missing)} missing, "
            f"{len(unexpected)} unexpected):\n{table}"
        )
    loadable = {k: v for k, v in state.items() if k in model_state and k not in mismatched}
    model.load_state_dict(loadable, strict=False)
    if rows:
        logger.warning(
            f"{_class_count_hint(mismatched, state, model_state)}loaded {len(loadable)}/{len(model_state)} "
            f"tensors; these were skipped:\n{table}"
        )
    return mismatched + missing


# exact types: numpy scalars subclass float/int but need arbitrary unpickling to load
_SAFE_LEAF_TYPES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def _check_weights_only_safe(obj: Any, where: str = "state") -> None:
    """Raise TypeError naming the first entry that `torch.load(weights_only=True)` could not read back."""
    if isinstance(obj, torch.Tensor) or type(obj) in _SAFE_LEAF_TYPES:
        return
    if type(obj) in (dict, OrderedDict):
        for k, v in obj.items():
            if type(k) not in (str, int):
                raise TypeError(f"checkpoint key {where}[{k!r}] is a {type(k).__name__}; use str or int keys")
            _check_weights_only_safe(v, f"{where}[{k!r}]")
        return
    if type(obj) in (list, tuple, torch.Size):
        for i, v in enumerate(obj):
            _check_weights_only_safe(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"checkpoint entry {where} is a {type(obj).__module__}.{type(obj).__name__}; checkpoints hold only "
        "tensors, numbers, strings, lists and dicts so that they load with weights_only=True"
    )


def _numpy_scalar_globals() -> list:
    """What numpy scalars unpickle through: official YOLOX checkpoints store best_ap/curr_ap as
    numpy.float64 (from COCOeval.stats). These rebuild plain numbers, never run code."""
    core = getattr(np, "_core", None) or np.core
    dtypes = [type(np.dtype(t)) for t in ("float64", "float32", "float16", "int64", "int32", "bool")]
    return [core.multiarray.scalar, np.dtype, *dtypes]


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write `state` to `path` atomically: a crash mid-write leaves the previous file intact.

    The bytes go to a temporary file in the same directory, are flushed and fsynced, then renamed
    over `path` (atomic on POSIX and Windows), and the directory is fsynced so the rename persists.
    Not enough room is an OSError that says so ("no space left on <folder> while writing <file>
    (needs about X MiB, Y MiB free)"), before writing when the shortage is known, else when the write
    fails; either way the previous file is untouched.
    """
    _check_weights_only_safe(state)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    need = _tensor_bytes(state)
    free = shutil.disk_usage(path.parent).free
    if need > free:
        raise _no_space(path, need, free)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(
        fd, 0o666 & ~umask
    )  # mkstemp makes 0600; a checkpoint is as readable as any file the user writes
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        if os.path.exists(tmp):
            os.unlink(tmp)
        # torch reports a full disk as its own RuntimeError ("unexpected pos ..."), not as ENOSPC
        if isinstance(err, (OSError, RuntimeError)):
            free = shutil.disk_usage(path.parent).free
            if getattr(err, "errno", None) == errno.ENOSPC or free < need - written:
                raise _no_space(path, need, free) from err
        raise
    _fsync_dir(path.parent)


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested state: about what torch.save will write."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _no_space(path: Path, need: int, free: int) -> OSError:
    return OSError(
        errno.ENOSPC,
        f"no space left on {path.parent} while writing {path.name} (needs about {need / 2**20:.1f} MiB, "
        f"{free / 2**20:.1f} MiB free); the previous {path.name}, if any, is intact",
    )


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":  # directories cannot be opened for fsync on Windows; rename is durable there
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


AGREED_RESTARTS_VAR = "YOLOX_FAST_RESTART_COUNT"  # the launcher's maximum over all ranks


def restart_count() -> int:
    """How many times this job was restarted: torchrun's elastic restarts (TORCHELASTIC_RESTART_COUNT)
    plus SLURM requeues (SLURM_RESTART_COUNT, kept by `sbatch --requeue` jobs); 0 on a first start.

    In a process group the launcher stores the maximum over all ranks in YOLOX_FAST_RESTART_COUNT, so
    every rank makes the same resume decision (two torchrun agents can count differently).
    """
    if AGREED_RESTARTS_VAR in os.environ:
        return int(os.environ[AGREED_RESTARTS_VAR])
    return sum(int(os.environ.get(k, "0")) for k in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"))


def resume_checkpoint_path(
    output_dir: str, resume: bool, ckpt: str | None, auto_resume: bool, restarts: int
) -> str | None:
    """Which checkpoint a training run continues from, or None for a fresh start (or a fine-tune from -c).

    - After a torchrun restart or a SLURM requeue (`restarts` > 0) the newest position,
      `<output_dir>/latest_ckpt.pth`, wins over -c and -e: otherwise finished epochs would be redone.
    - `--resume` continues from -c if given, else from latest (an error if it does not exist).
    - `--auto-resume` (and any restart) continues from latest when it exists, else starts fresh.
    """
    latest = os.path.join(output_dir, "latest_ckpt.pth")
    if restarts > 0 and os.path.isfile(latest):
        logger.info(f"restart {restarts} (torchrun restart or SLURM requeue): continuing from {latest}")
        return latest
    if resume:
        path = ckpt or latest
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--resume: no checkpoint at {path}")
        return path
    if (auto_resume or restarts > 0) and os.path.isfile(latest):
        logger.info(f"auto-resume (restart {restarts}): continuing from {latest}")
        return latest
    return None
