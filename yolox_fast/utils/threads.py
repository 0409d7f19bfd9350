"""CPU threading helpers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def single_threaded_on_cpu(device: torch.device) -> Iterator[None]:
    """On CPU, run the enclosed ops on one thread (restored afterwards); elsewhere a no-op.

    The assigner's and the loss's ops are small (a few MiB per chunk), and when other processes (data
    workers) keep the cores busy, each op's OpenMP hand-off can stall for milliseconds: measured 20-60x
    slower with 2 threads on a loaded 2-core VM.
    """
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
