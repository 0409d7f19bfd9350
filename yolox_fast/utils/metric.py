"""Running meters for the training log, and the device probes of a measurement on CUDA and CPU: memory,
and the sync before a clock is read."""

from __future__ import annotations

from collections import deque

import psutil
import torch


class AverageMeter:
    """The last ``window`` values of one quantity: latest and windowed average."""

    def __init__(self, window: int = 50) -> None:
        self._window = deque(maxlen=window)

    def update(self, value: float) -> None:
        self._window.append(value)

    @property
    def latest(self) -> float:
        return self._window[-1] if self._window else float("nan")

    @property
    def avg(self) -> float:
        return sum(self._window) / len(self._window) if self._window else float("nan")


class MeterBuffer:
    """One AverageMeter per name, created on first update."""

    def __init__(self, window: int = 20) -> None:
        self.window = window
        self.meters: dict[str, AverageMeter] = {}

    def update(self, **values: float) -> None:
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                value = value.detach().item()
            self.meters.setdefault(name, AverageMeter(self.window)).update(float(value))

    def __getitem__(self, name: str) -> AverageMeter:
        return self.meters[name]

    def __contains__(self, name: str) -> bool:
        return name in self.meters


def memory_mb(device: torch.device) -> float:
    """Peak allocated CUDA memory of ``device`` in MiB, or this process's resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return psutil.Process().memory_info().rss / 2**20


def sync_device(device: torch.device) -> None:
    """Wait for `device`'s queued work: CUDA kernels run asynchronously, so a clock read without this sync
    times their launch, not their work (a no-op on a CPU, which runs them before returning)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
