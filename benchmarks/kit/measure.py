"""Measuring: repeated measurements of several sides taken in turn (load from other processes then hits all
alike), the time of a call, the memory a call adds at its peak, and how the figures are printed (median and
range of the repeats, the ratio against the baseline, the setting a run was measured in)."""

from __future__ import annotations

import ctypes
import gc
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import numpy as np
import torch

from yolox_fast.utils.metric import sync_device

Value = TypeVar("Value")  # a measurement: seconds, a rate, or a row of them


def alternate(sides: dict[Hashable, Callable[[], Value]], repeats: int) -> dict[Hashable, list[Value]]:
    """Call each side's measurement once per round, in turn, for `repeats` rounds; every value."""
    values: dict[Hashable, list[Value]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, measure in sides.items():
            values[name].append(measure())
    return values


def timed(
    run: Callable[[], object], calls: int = 1, device: torch.device | None = None, clock=time.perf_counter
) -> Callable[[], float]:
    """A measurement for `alternate`: seconds per call of `calls` calls of `run` by `clock` (wall time, or
    `time.process_time` for this process's CPU time), `device` synchronised before and after (a GPU's
    queued kernels count when they end)."""

    def measure() -> float:
        if device is not None:
            sync_device(device)
        t0 = clock()
        for _ in range(calls):
            run()
        if device is not None:
            sync_device(device)
        return (clock() - t0) / calls

    return measure


def value_range(values: Sequence[float], digits: int) -> str:
    """'min-max' of the repeats: how far load moved them."""
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def median_and_range(values: Sequence[float], digits: int) -> list[str]:
    """A row's two cells for repeated values: their median and `value_range`."""
    return [f"{statistics.median(values):.{digits}f}", value_range(values, digits)]


def ratio(value: float, base: float) -> str:
    """A ratio cell, "1.23x"."""
    return f"{value / base:.2f}x"


def spread(values: Sequence[float]) -> str:
    """Values over seeds as "mean [min-max]" (the value alone when there is one, "-" when none)."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def setting(device: torch.device, amp_dtype) -> str:
    """Where and in which precision a benchmark runs, for its heading: "CPU, 2 threads, fp32"."""
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    return f"{where}, {str(amp_dtype).replace('torch.', '') if amp_dtype else 'fp32'}"


def status_kib(field: str) -> int:
    """A kB field of /proc/self/status ("VmRSS:", "VmHWM:")."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_rss_peak() -> None:
    """Start this process's resident-set high-water mark (VmHWM) again from its current size (Linux 4.0+;
    getrusage's ru_maxrss cannot be reset, and a child starts with its parent's)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class CpuPeak:
    """Resident-set high-water mark of this process above its level at `start()`, with glibc told to serve
    every block over 64 KiB by mmap and to trim freed memory, so freed tensors leave the resident set at once
    and cannot be silently reused (which slows allocation down: measure memory apart from time)."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL("libc.so.6")
        self.libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: fixed, which also stops glibc raising it
        self.libc.mallopt(-1, 0)  # M_TRIM_THRESHOLD: give freed heap top back at once

    def start(self) -> None:
        gc.collect()
        self.libc.malloc_trim(0)
        reset_rss_peak()
        self.base = status_kib("VmRSS:")

    def stop(self) -> int:
        return (status_kib("VmHWM:") - self.base) * 1024


def peak_bytes(fn: Callable[[], object], device: torch.device, cpu_peak: CpuPeak | None) -> int:
    """Extra memory at the peak of one call of fn: CUDA's allocated bytes, or `cpu_peak`'s on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    cpu_peak.start()
    fn()
    return cpu_peak.stop()
