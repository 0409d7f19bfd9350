"""Training throughput of YOLOX-Nano: batched SimOTA against the per-image reference assigner, same run.

    python tools/benchmark.py train                       # CPU: batch 8 and 32 at 416 px
    python tools/benchmark.py train --fp16                # CUDA: batch 64 and 256, fp16 autocast + GradScaler

Each timed iteration is a full training step (forward, SimOTA, loss, backward, SGD step) on random
images with realistic random ground truth (5-40 boxes per image, 80 classes); data loading is left
out so that the figures isolate what the assigner changes.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from tabulate import tabulate

from yolox_fast.core.trainer import resolve_amp_dtype
from yolox_fast.exp import get_exp


@contextmanager
def assigner(name: str, loss_seconds: list, sync) -> Iterator[None]:
    """Make the YOLOX loss use `simota_assign` ("batched") or `simota_assign_reference` ("reference"),
    and append the wall time of each loss call (assignment + loss forward) to `loss_seconds`."""
    from yolox_fast.models import losses, simota

    original_assign, original_loss = losses.simota_assign, losses.yolox_loss

    def timed_loss(*args, **kwargs):
        sync()
        t0 = time.perf_counter()
        out = original_loss(*args, **kwargs)
        sync()
        loss_seconds.append(time.perf_counter() - t0)
        return out

    losses.simota_assign = simota.simota_assign if name == "batched" else simota.simota_assign_reference
    losses.yolox_loss = timed_loss  # the head looks it up at call time
    try:
        yield
    finally:
        losses.simota_assign, losses.yolox_loss = original_assign, original_loss


def random_targets(batch: int, size: int, num_classes: int, gen: torch.Generator, max_labels: int = 120) -> torch.Tensor:
    """(B, max_labels, 5) [cls, cx, cy, w, h] px: 5-40 boxes per image, 8 px to half the image, zero-padded."""
    targets = torch.zeros(batch, max_labels, 5)
    for i in range(batch):
        n = int(torch.randint(5, 41, (1,), generator=gen))
        wh = torch.empty(n, 2).uniform_(8, size / 2, generator=gen)
        centre = torch.rand(n, 2, generator=gen) * (size - wh) + wh / 2
        targets[i, :n, 0] = torch.randint(0, num_classes, (n,), generator=gen).float()
        targets[i, :n, 1:3] = centre
        targets[i, :n, 3:5] = wh
    return targets


def measure(args, batch: int, which: str, device: torch.device, amp_dtype: torch.dtype | None) -> dict[str, float]:
    """Seconds per training step, the share of it spent in assignment + loss forward, and peak CUDA
    memory, with `which` assigner at batch `batch`."""
    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = args.num_classes
    torch.manual_seed(0)
    model = exp.get_model().to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is torch.float16)
    gen = torch.Generator().manual_seed(batch)
    imgs = (torch.rand(batch, 3, args.size, args.size, generator=gen) * 255).to(device)
    targets = random_targets(batch, args.size, args.num_classes, gen).to(device)

    def step() -> None:
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = model(imgs, targets)["total_loss"]
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    loss_seconds: list[float] = []
    with assigner(which, loss_seconds, sync):
        for _ in range(args.warmup):
            step()
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        loss_seconds.clear()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            step()
        sync()
        seconds = (time.perf_counter() - t0) / args.iters
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    loss_share = sum(loss_seconds) / args.iters / seconds
    return {"s_per_iter": seconds, "img_s": batch / seconds, "peak_mib": peak, "loss_share": loss_share}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser("python tools/benchmark.py train")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                        help="default: 8 32 on CPU, 64 256 on CUDA")
    parser.add_argument("--size", type=int, default=416)
    parser.add_argument("--num-classes", type=int, default=80)
    parser.add_argument("--iters", type=int, default=None, help="timed steps per setting (default 4 CPU, 20 CUDA)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    amp = parser.add_mutually_exclusive_group()
    amp.add_argument("--fp16", action="store_true", help="fp16 autocast + GradScaler (bf16 on CPU)")
    amp.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if (args.device == "auto" and torch.cuda.is_available()) or args.device == "cuda" else "cpu")
    batches = args.batch_sizes or ([64, 256] if device.type == "cuda" else [8, 32])
    args.iters = args.iters or (20 if device.type == "cuda" else 4)
    amp_dtype = resolve_amp_dtype(args.fp16, args.bf16, device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True

    rows = []
    for batch in batches:
        ref = measure(args, batch, "reference", device, amp_dtype)
        fast = measure(args, batch, "batched", device, amp_dtype)
        for name, r in (("reference (per image)", ref), ("batched simota_assign", fast)):
            rows.append([
                batch, name, f"{r['s_per_iter']:.3f}", f"{r['img_s']:.1f}",
                f"{r['img_s'] / ref['img_s']:.2f}x", f"{100 * r['loss_share']:.1f}%", "-" if r["peak_mib"] != r["peak_mib"] else f"{r['peak_mib']:.0f}",
            ])
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    precision = str(amp_dtype).replace("torch.", "") if amp_dtype else "fp32"
    print(f"YOLOX-Nano training step at {args.size} px, {args.num_classes} classes, {where}, {precision}, "
          f"{args.iters} timed steps after {args.warmup} warm-up")
    print(tabulate(rows, headers=["batch", "assigner", "s/iter", "img/s", "vs reference", "assign+loss share", "peak MiB"],
                   tablefmt="github"))
