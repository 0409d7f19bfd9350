"""Mixed precision: which autocast dtype a --fp16 / --bf16 request means on a device, and the context.

The one rule of the project: fp16 is for CUDA. On a CPU, fp16 convolutions are slow or missing, so
--fp16 there means bfloat16 (said once per process).
"""

from __future__ import annotations

import contextlib

import torch
from loguru import logger

_warned_cpu_fp16 = False


def amp_dtype(device: torch.device | str, fp16: bool = False, bf16: bool = False) -> torch.dtype | None:
    """Autocast dtype for --fp16/--bf16 on `device`; None means full fp32."""
    global _warned_cpu_fp16
    device = torch.device(device)
    if fp16 and bf16:
        raise ValueError("--fp16 and --bf16 are exclusive: choose one")
    if bf16:
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError(
                f"--bf16: {torch.cuda.get_device_name(device)} has no bfloat16 support; use --fp16"
            )
        return torch.bfloat16
    if not fp16:
        return None
    if device.type == "cuda":
        return torch.float16
    if not _warned_cpu_fp16:
        logger.warning("--fp16 on a CPU: using bfloat16 autocast instead (fp16 is not fast on CPU)")
        _warned_cpu_fp16 = True
    return torch.bfloat16


def autocast(device: torch.device | str, dtype: torch.dtype | None):
    """`torch.autocast` to `dtype` on the device's type, or a no-op context when dtype is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)
