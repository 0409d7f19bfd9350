"""Training throughput of YOLOX-Nano: batched SimOTA against the per-image reference assigner, same run.

    python tools/benchmark.py train                       # CPU: batch 8 and 32 at 416 px
    python tools/benchmark.py train --fp16                # CUDA: batch 64 and 256, fp16 autocast + GradScaler

    python tools/benchmark.py train --compile --batch-sizes 8   # also the step of the torch.compile'd model

Each timed iteration is a full training step (forward, SimOTA, loss, backward, SGD step) on random
images with realistic random ground truth (5-40 boxes per image, 80 classes), in the trainer's memory
layout (channels_last); data loading is left out so that the figures isolate what the assigner changes.
With --compile a third row times the batched step of the compiled model after warm-up steps that build
its graphs (their compile seconds in the row's name).

"GFLOP/s" is the FLOPs of one step's forward + backward per image (torch's FlopCounterMode, counted once on
a batch of 2: they scale linearly with the batch; the SGD step's elementwise work is not counted) times
img/s; "of peak" divides it by the matmul / 3x3-conv peak measured in the same run, same device, threads
and dtype (`benchmarks.kit.peak`; `--peak-repeats`).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from tabulate import tabulate

from benchmarks.kit.measure import ratio, setting
from benchmarks.kit.peak import achieved_columns, measured_peak, peak_line, train_step_flops_per_image
from benchmarks.kit.steps import grad_checkpoint_peak, step_inputs
from yolox_fast.models.losses import YOLOXLoss
from yolox_fast.models.simota import simota_assign
from yolox_fast.models.simota_reference import simota_assign_reference
from yolox_fast.utils import amp
from yolox_fast.utils.compile import MODES, compile_module, compile_stats

ASSIGNERS = {"batched": simota_assign, "reference": simota_assign_reference}


def timed_loss(loss: YOLOXLoss, assigner, loss_seconds: list, sync):
    """A head `loss_fn`: the head's `loss` with `assigner`, appending the wall time of each call
    (assignment + loss forward) to `loss_seconds`."""
    with_assigner = dataclasses.replace(loss, assigner=assigner)

    def loss_fn(*args, **kwargs):
        sync()
        t0 = time.perf_counter()
        out = with_assigner(*args, **kwargs)
        sync()
        loss_seconds.append(time.perf_counter() - t0)
        return out

    return loss_fn


def measure(
    args, batch: int, which: str, device: torch.device, amp_dtype: torch.dtype | None, compiled: bool = False
) -> dict[str, float]:
    """Seconds per training step, the share of it spent in assignment + loss forward, and peak CUDA
    memory, with `which` assigner at batch `batch`; `compiled`: the model torch.compile'd (its graphs
    built in the warm-up steps, their seconds in "compile_s")."""
    model, imgs, targets = step_inputs(args, batch, device)
    if compiled:
        compile_module(model, args.compile_mode)
        before = compile_stats().seconds
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is torch.float16)

    def step() -> None:
        with amp.autocast(device, amp_dtype):
            loss = model(imgs, targets)["total_loss"]
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    loss_seconds: list[float] = []
    model.head.loss_fn = timed_loss(model.head.loss_fn, ASSIGNERS[which], loss_seconds, sync)
    for _ in range(args.warmup):
        step()
    sync()
    compile_s = compile_stats().seconds - before if compiled else 0.0
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
    return {"s_per_iter": seconds, "img_s": batch / seconds, "peak_mib": peak, "loss_share": loss_share,
            "compile_s": compile_s}  # fmt: skip


def print_grad_checkpoint_saving(args, batches, device: torch.device, amp_dtype) -> None:
    rows = []
    for batch in batches:
        plain = grad_checkpoint_peak(args, batch, False, device, amp_dtype) / 2**20
        ckpt = grad_checkpoint_peak(args, batch, True, device, amp_dtype) / 2**20
        rows.append([batch, f"{plain:.0f}", f"{ckpt:.0f}", f"{plain / batch:.1f}", f"{ckpt / batch:.1f}",
                     f"{ckpt / plain:.2f}"])  # fmt: skip
    kind = "CUDA allocated" if device.type == "cuda" else "CPU resident-set high-water"
    print(f"YOLOX-Nano forward + backward at {args.size} px, peak extra memory ({kind}), MiB")
    headers = ["batch", "plain", "checkpointed", "plain/img", "checkpointed/img", "ratio"]
    print(tabulate(rows, headers=headers, tablefmt="github"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser("python tools/benchmark.py train")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=None, help="default: 8 32 on CPU, 64 256 on CUDA"
    )
    parser.add_argument("--size", type=int, default=416)
    parser.add_argument("--num-classes", type=int, default=80)
    parser.add_argument(
        "--iters", type=int, default=None, help="timed steps per setting (default 4 CPU, 20 CUDA)"
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--peak-repeats", type=int, default=5, help="timed runs of the peak measurement")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="fp16 autocast + GradScaler (bf16 on CPU)")
    precision.add_argument("--bf16", action="store_true")
    parser.add_argument(
        "--grad-checkpoint",
        action="store_true",
        help="instead: peak memory of one step with and without activation checkpointing",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also the batched step with the model torch.compile'd (inductor); compile time printed apart",
    )
    parser.add_argument("--compile-mode", choices=MODES, default="default")
    args = parser.parse_args(argv)
    if args.compile:
        args.warmup = max(args.warmup, 2)  # the first steps build the graphs

    device = torch.device(
        "cuda" if (args.device == "auto" and torch.cuda.is_available()) or args.device == "cuda" else "cpu"
    )
    batches = args.batch_sizes or ([64, 256] if device.type == "cuda" else [8, 32])
    args.iters = args.iters or (20 if device.type == "cuda" else 4)
    amp_dtype = amp.amp_dtype(device, fp16=args.fp16, bf16=args.bf16)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    if args.grad_checkpoint:
        print_grad_checkpoint_saving(args, batches, device, amp_dtype)
        return

    model, imgs, targets = step_inputs(args, 2, device)
    flops_per_image = train_step_flops_per_image(model, imgs, targets, amp_dtype)
    del model, imgs, targets
    rows = []
    for batch in batches:
        ref = measure(args, batch, "reference", device, amp_dtype)
        sides = [
            ("reference (per image)", ref),
            ("batched simota_assign", measure(args, batch, "batched", device, amp_dtype)),
        ]
        if args.compile:
            compiled = measure(args, batch, "batched", device, amp_dtype, compiled=True)
            sides.append((f"batched, torch.compile ({compiled['compile_s']:.0f} s compiling)", compiled))
        for name, r in sides:
            peak_mib = "-" if r["peak_mib"] != r["peak_mib"] else f"{r['peak_mib']:.0f}"
            speed = [f"{r['s_per_iter']:.3f}", f"{r['img_s']:.1f}", ratio(r["img_s"], ref["img_s"])]
            rows.append([batch, name, *speed, f"{100 * r['loss_share']:.1f}%", peak_mib, r["img_s"]])
    peak = measured_peak(device, amp_dtype, args.peak_repeats)
    for row in rows:
        row[-1:] = achieved_columns(flops_per_image, row[-1], peak)
    print(
        f"YOLOX-Nano training step at {args.size} px, {args.num_classes} classes, "
        f"{setting(device, amp_dtype)}, {args.iters} timed steps after {args.warmup} warm-up; "
        f"{flops_per_image / 1e9:.2f} GFLOPs per image per step"
    )
    print(peak_line(peak, setting(device, amp_dtype)))
    headers = ["batch", "assigner", "s/iter", "img/s", "vs reference", "assign+loss share", "peak MiB",
               "GFLOP/s", "of peak"]  # fmt: skip
    print(tabulate(rows, headers=headers, tablefmt="github"))
