"""Thin helpers over torch.distributed that also work when it is not initialised (single process)."""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch
import torch.distributed as dist

# DistributedDataParallel's keyword that keeps BN statistics per rank while training, as in YOLOX (they are
# averaged before each eval, `average_bn_stats`); newer torch names it forward_sync_buffers and deprecates
# broadcast_buffers
DDP_NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.parallel.DistributedDataParallel:
    """`model` (on `device`) in DistributedDataParallel, its BN statistics kept per rank
    (DDP_NO_BUFFER_SYNC)."""
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **DDP_NO_BUFFER_SYNC)


def is_distributed() -> bool:
    """True inside an initialised process group with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_local_rank() -> int:
    """Rank on this machine: torchrun's LOCAL_RANK, else the global rank."""
    return int(os.environ.get("LOCAL_RANK", get_rank()))


def local_device() -> torch.device:
    """This process's device: the current CUDA device (launch sets it from the local rank), else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize() -> None:
    """Barrier across ranks; a no-op in a single process."""
    if is_distributed():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` in place across ranks and return it (unchanged in a single process)."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Every rank gets rank `src`'s `obj` (any picklable object)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """List of every rank's `obj`, in rank order, on every rank."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """List of every rank's `obj` on rank `dst` (None elsewhere)."""
    if not is_distributed():
        return [obj]
    out: list[Any] | None = [None] * get_world_size() if get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


@torch.no_grad()
def average_bn_stats(model: torch.nn.Module) -> None:
    """Average BatchNorm running mean/var over ranks, so every rank evaluates the same model.

    DDP averages gradients, not buffers: with its buffer broadcast off (as YOLOX trains) each rank's BN
    statistics drift on its own shard of the data.
    """
    world = get_world_size()
    if world == 1:
        return
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            for buf in (m.running_mean, m.running_var):
                all_reduce_sum(buf)
                buf.div_(world)
