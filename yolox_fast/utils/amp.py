"""Mixed precision: which autocast dtype a --fp16 / --bf16 request means on a device, and the context.

The one rule of the project: fp16 is for CUDA. On a CPU, fp16 convolutions are slow or missing, so
--fp16 there means bfloat16 (said once per process), unless the exp asks for the real fp16 path with
`cpu_amp_dtype = "fp16"`: fp16 autocast and loss scaling, the path of every GPU run, to try it on a CPU.
"""

from __future__ import annotations

import contextlib

import torch
from loguru import logger

_warned_cpu_fp16 = False


CPU_AMP_DTYPES = ("bf16", "fp16")  # the values of exp.cpu_amp_dtype


def amp_dtype(
    device: torch.device | str, fp16: bool = False, bf16: bool = False, cpu_dtype: str = "bf16"
) -> torch.dtype | None:
    """Autocast dtype for --fp16/--bf16 on `device`; None means full fp32.

    `cpu_dtype` (exp.cpu_amp_dtype, "bf16" or "fp16") is what --fp16 means on a CPU: "fp16" gives
    float16, for which the trainer scales the loss as on CUDA.
    """
    global _warned_cpu_fp16
    if cpu_dtype not in CPU_AMP_DTYPES:
        raise ValueError(f"cpu_dtype must be one of {CPU_AMP_DTYPES}, got {cpu_dtype!r}")
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
    if device.type == "cuda" or (device.type == "cpu" and cpu_dtype == "fp16"):
        return torch.float16
    if not _warned_cpu_fp16:
        logger.warning(
            "--fp16 on a CPU: using bfloat16 autocast instead (fp16 is not fast on CPU; "
            "cpu_amp_dtype fp16 runs the real fp16 path with loss scaling)"
        )
        _warned_cpu_fp16 = True
    return torch.bfloat16


def autocast(device: torch.device | str, dtype: torch.dtype | None):
    """`torch.autocast` to `dtype` on the device's type, or a no-op context when dtype is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def loss_scaler(
    device: torch.device | str,
    dtype: torch.dtype | None,
    init_scale: float = 2.0**16,
    growth_interval: int = 2000,
) -> torch.amp.GradScaler:
    """The loss scaler of a run autocast to `dtype`: enabled for fp16 only (bf16 has fp32's exponent range);
    `init_scale` and `growth_interval` as torch's GradScaler's (exp.scaler_init_scale and
    scaler_growth_interval)."""
    return torch.amp.GradScaler(
        torch.device(device).type,
        init_scale=init_scale,
        growth_interval=growth_interval,
        enabled=dtype is torch.float16,
    )
