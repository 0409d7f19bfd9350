"""How far from the machine's limit a benchmark runs: achieved FLOP/s against a peak measured in the same run.

The peak is the faster of a large fp32 (or autocast-dtype) matmul and a large 3x3 convolution, timed on the
benchmark's own device and threads just before its figures are printed; a model's FLOPs are counted by
torch's FlopCounterMode (2 FLOPs per multiply-add, convolutions and matmuls only, as usual GFLOPs figures).
A model's FLOPs per image are counted once on a small batch (they scale linearly with the batch), and the
achieved rate of a row is FLOPs/image x its images/s.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from yolox_fast.utils import amp
from yolox_fast.utils.metric import sync_device


def _best_rate(fn, flops: float, device: torch.device, repeats: int) -> float:
    fn()
    sync_device(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync_device(device)
        best = min(best, time.perf_counter() - t0)
    return flops / best


def measured_peak(
    device: torch.device, amp_dtype: torch.dtype | None = None, repeats: int = 5
) -> dict[str, float]:
    """FLOP/s of a 2048^3 (4096^3 on CUDA) matmul and of a 256->256 3x3 convolution on 56x56 maps, in
    `amp_dtype` (fp32 when None); the "peak" entry is the larger."""
    n = 4096 if device.type == "cuda" else 2048
    dtype = amp_dtype or torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    conv = torch.nn.Conv2d(256, 256, 3, padding=1, bias=False).to(device)
    x = torch.randn(8, 256, 56, 56, device=device).contiguous(memory_format=torch.channels_last)
    conv = conv.to(memory_format=torch.channels_last)

    def run_conv() -> None:
        with torch.no_grad(), amp.autocast(device, amp_dtype):
            conv(x)

    matmul = _best_rate(lambda: a @ b, 2.0 * n**3, device, repeats)
    conv_rate = _best_rate(run_conv, 2.0 * 8 * 256 * 256 * 9 * 56 * 56, device, repeats)
    return {"matmul": matmul, "conv": conv_rate, "peak": max(matmul, conv_rate)}


def counted_flops(fn) -> int:
    """FLOPs torch counts while `fn()` runs (forward, and backward when `fn` calls it)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def train_step_flops_per_image(
    model: torch.nn.Module, imgs: torch.Tensor, targets: torch.Tensor, amp_dtype: torch.dtype | None = None
) -> float:
    """FLOPs per image of one training forward + backward of `model` (train mode, returning a dict with
    "total_loss") on `imgs` (B, 3, H, W) and `targets`; its gradients are cleared afterwards."""

    def step() -> None:
        with amp.autocast(imgs.device, amp_dtype):
            loss = model(imgs, targets)["total_loss"]
        loss.backward()

    flops = counted_flops(step)
    model.zero_grad(set_to_none=True)
    return flops / imgs.shape[0]


def forward_flops_per_image(
    model: torch.nn.Module, size: tuple[int, int], device: torch.device, amp_dtype: torch.dtype | None = None
) -> float:
    """FLOPs of one inference forward of `model` on a (1, 3, H, W) input, `size` = (H, W)."""
    x = torch.zeros(1, 3, *size, device=device)
    with torch.no_grad(), amp.autocast(device, amp_dtype):
        return float(counted_flops(lambda: model(x)))


def achieved_columns(flops_per_image: float, images_per_second: float, peak: dict[str, float]) -> list[str]:
    """A row's "GFLOP/s" and "of peak" cells: FLOPs/image x images/s, and that over the measured peak."""
    rate = flops_per_image * images_per_second

    def figure(value: float) -> str:  # three significant digits: a tiny test run must not print 0.0
        # "#": trailing zeros kept, so 6.0 prints 6.00 beside 5.70, not a bare 6 (99.96: "100", not "100.")
        return f"{value:#.3g}".rstrip(".") if value < 100 else f"{value:.0f}"

    return [figure(rate / 1e9), f"{figure(100 * rate / peak['peak'])}%"]


def peak_line(peak: dict[str, float], what: str) -> str:
    """One sentence for a benchmark's heading: the measured peak in GFLOP/s."""
    return (
        f"{what} peak measured in this run: {peak['peak'] / 1e9:.0f} GFLOP/s "
        f"(matmul {peak['matmul'] / 1e9:.0f}, 3x3 conv {peak['conv'] / 1e9:.0f})"
    )
