"""Benchmark: batched `simota_assign` against the per-image reference, in the same process.

    python tools/benchmark.py simota                       # CPU: N in 8 32 64 256, 416 and 640 px
    python tools/benchmark.py simota --device cuda --full  # also time the N=256 reference
    python tools/benchmark.py simota --budget              # N=256, 640 px, 120 GTs within 1 GiB

Inputs are random but shaped like training: 5-40 GTs per image (padded to 120) with log-uniform sizes,
predicted boxes jittered around the GT they sit in, logits in the ranges a trained head produces.

Peak memory is the extra memory above what was live before the call:
- CUDA: torch.cuda.max_memory_allocated() after reset_peak_memory_stats();
- CPU: the kernel's resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs) minus
  the resident set before the call, with glibc told to serve every block over 64 KiB by mmap and to
  trim freed memory, so freed tensors leave the resident set at once and cannot be silently reused.
  Memory runs are separate from timed runs (the mmap setting slows allocation down).
Times are the fastest of the repeats (after a warm-up call). When the CPU reference at N=256 is not
timed (without --full), its time is estimated from the first `--est-images` images scaled to N and
marked "est."; its memory is always measured on the whole batch (one call).
The extra memory includes the (N, A) outputs, which both versions allocate.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch
from loguru import logger
from tabulate import tabulate

from benchmarks.kit.inputs import make_inputs  # the batches the tests check the assigner on
from yolox_fast.models.simota import simota_assign
from yolox_fast.models.simota_reference import simota_assign_reference
from yolox_fast.utils import amp
from yolox_fast.utils.metric import sync_device


def time_call(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Fastest of `repeats` calls after one warm-up call, in seconds: on a shared machine the noise is
    other processes' load, which only ever adds time."""
    fn()
    times = []
    for _ in range(repeats):
        sync_device(device)
        t0 = time.perf_counter()
        fn()
        sync_device(device)
        times.append(time.perf_counter() - t0)
    return min(times)


class CpuPeak:
    """Resident-set high-water mark of this process above its level at `start()` (see module docstring)."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL("libc.so.6")
        self.libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: fixed, which also stops glibc raising it
        self.libc.mallopt(-1, 0)  # M_TRIM_THRESHOLD: give freed heap top back at once

    @staticmethod
    def _status_kib(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
        raise RuntimeError(f"{field} not in /proc/self/status")

    def start(self) -> None:
        gc.collect()
        self.libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        self.base = self._status_kib("VmRSS:")

    def stop(self) -> int:
        return (self._status_kib("VmHWM:") - self.base) * 1024


def peak_bytes(fn: Callable[[], object], device: torch.device, cpu_peak: CpuPeak | None) -> int:
    """Extra memory at the peak of one call of fn."""
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


def official_assigner() -> Callable[..., object] | None:
    """YOLOX 0.3.0's assignment in `simota_assign`'s argument layout: its head's `get_assignments`, image by
    image as its `get_losses` calls it; None when official YOLOX is not importable (run with the
    reference python, tools/setup_yolox_reference.sh)."""
    try:
        from yolox.models.yolo_head import YOLOXHead as OfficialHead
    except ImportError:
        return None
    heads: dict[int, object] = {}

    def assign(pred_boxes, cls_logits, obj_logits, anchor_points, strides, gt_boxes, gt_classes, gt_mask):
        num_images, num_anchors, num_classes = cls_logits.shape
        if num_classes not in heads:
            heads[num_classes] = OfficialHead(num_classes, width=0.25).to(pred_boxes.device)
        head = heads[num_classes]
        x_shifts = (anchor_points[:, 0] / strides - 0.5)[None]  # cell indices, as official keeps them
        y_shifts = (anchor_points[:, 1] / strides - 0.5)[None]
        labels = torch.cat([gt_classes[..., None].float(), gt_boxes], -1) * gt_mask[..., None]
        for i in range(num_images):
            num_gt = int(gt_mask[i].sum())  # official reads the first num_gt rows
            if num_gt:
                gts, classes = gt_boxes[i, :num_gt], gt_classes[i, :num_gt].float()
                head.get_assignments(
                    i, num_gt, num_anchors, gts, classes, pred_boxes[i],
                    strides[None], x_shifts, y_shifts, cls_logits, pred_boxes, obj_logits, labels, None,
                )  # fmt: skip

    return assign


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def _slice(batch: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    shared = ("anchor_points", "strides")
    return {k: (v if k in shared else v[:n]) for k, v in batch.items()}


def run_table(
    sizes: Sequence[int],
    batch_sizes: Sequence[int],
    num_classes: int,
    device: torch.device,
    repeats: int,
    full: bool,
    est_images: int,
    max_bytes: int | None,
    amp_dtype: torch.dtype | None = None,
) -> list[list]:
    """One row per (size, N): seconds per call and peak memory of the batched assigner, the per-image
    reference and (when importable) official YOLOX 0.3.0, with the speed-ups against both."""
    official = official_assigner()
    per_image = {"reference": simota_assign_reference, **({"official": official} if official else {})}
    rows = []
    timed = {}

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None)

    def under_autocast(fn, **batch):
        def call():
            with autocast():
                fn(**batch)

        return call

    for size in sizes:
        batch_all = make_inputs(max(batch_sizes), size, num_classes, device=device)
        if amp_dtype is not None:  # the head's outputs under autocast: half-precision predictions
            for key in ("pred_boxes", "cls_logits", "obj_logits"):
                batch_all[key] = batch_all[key].to(amp_dtype)
        for n in batch_sizes:
            batch = _slice(batch_all, n)
            fast = time_call(
                under_autocast(partial(simota_assign, max_bytes=max_bytes), **batch), device, repeats
            )
            estimate = device.type == "cpu" and n >= 256 and not full
            times = {"batched": fast}
            for name, fn in per_image.items():
                slow_repeats = max(2, repeats // 2)
                if estimate:
                    sub = _slice(batch_all, est_images)
                    times[name] = time_call(under_autocast(fn, **sub), device, slow_repeats) * n / est_images
                else:
                    times[name] = time_call(under_autocast(fn, **batch), device, slow_repeats)
            timed[(size, n)] = (times, estimate)
            logger.info(f"{size} px N={n}: " + ", ".join(f"{k} {v:.4f} s" for k, v in times.items()))
    cpu_peak = CpuPeak() if device.type == "cpu" else None
    for size in sizes:
        batch_all = make_inputs(max(batch_sizes), size, num_classes, device=device)
        for n in batch_sizes:
            batch = _slice(batch_all, n)
            times, estimate = timed[(size, n)]
            mem = {
                "batched": peak_bytes(partial(simota_assign, **batch, max_bytes=max_bytes), device, cpu_peak)
            }
            for name, fn in per_image.items():
                mem[name] = peak_bytes(partial(fn, **batch), device, cpu_peak)  # one call, always
            tag = " (est.)" if estimate else ""
            row = [n, size, f"{times['reference']:.4f}{tag}"]
            row += [f"{times['official']:.4f}{tag}"] if official else []
            row += [f"{times['batched']:.4f}", f"{times['reference'] / times['batched']:.1f}x{tag}"]
            row += [f"{times['official'] / times['batched']:.1f}x{tag}"] if official else []
            row += [_mib(mem["reference"])] + ([_mib(mem["official"])] if official else [])
            row += [
                _mib(mem["batched"]),
                f"{mem['batched'] / max(mem.get('official', mem['reference']), 1):.2f}",
            ]
            rows.append(row)
    return rows


def table_headers(with_official: bool) -> list[str]:
    official = with_official
    return (
        ["N", "size", "ref s/call"]
        + (["official s/call"] if official else [])
        + ["batched s/call", "vs ref"]
        + (["vs official"] if official else [])
        + ["ref peak MiB"]
        + (["official peak MiB"] if official else [])
        + ["batched peak MiB", "mem vs " + ("official" if official else "ref")]
    )


def run_budget(device: torch.device, budget: int, num_classes: int) -> None:
    """N=256, 640 px, 120 GTs per image under a max_bytes budget: time and measured peak."""
    batch = make_inputs(256, 640, num_classes, min_gt=120, max_gt=120, device=device)
    cpu_peak = CpuPeak() if device.type == "cpu" else None
    t0 = time.perf_counter()
    result = simota_assign(**batch, max_bytes=budget)
    sync_device(device)
    seconds = time.perf_counter() - t0
    peak = peak_bytes(lambda: simota_assign(**batch, max_bytes=budget), device, cpu_peak)
    print(
        tabulate(
            [
                [
                    256,
                    640,
                    120,
                    _mib(budget),
                    f"{seconds:.2f}",
                    _mib(peak),
                    f"{peak / budget:.2f}",
                    result.num_fg,
                ]
            ],
            headers=["N", "size", "GTs/img", "max_bytes MiB", "s/call", "peak MiB", "peak/budget", "num_fg"],
            tablefmt="github",
        )
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmark.py simota", description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", "-n", type=int, nargs="+", default=[8, 32, 64, 256])
    parser.add_argument("--sizes", type=int, nargs="+", default=[416, 640], help="square input sizes, px")
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed calls of the batched version (the fastest counts)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--full", action="store_true", help="time the CPU reference at N>=256 instead of estimating"
    )
    parser.add_argument(
        "--est-images", type=int, default=16, help="images timed to estimate a skipped reference"
    )
    parser.add_argument("--max-bytes", type=int, default=None, help="simota_assign budget (default: its own)")
    parser.add_argument(
        "--budget", action="store_true", help="only the N=256 / 640 px / 120 GTs budget check"
    )
    parser.add_argument("--budget-bytes", type=int, default=2**30)
    parser.add_argument("--fp16", action="store_true", help="predictions in half precision, under autocast")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.budget:
        run_budget(device, args.budget_bytes, args.classes)
        return
    amp_dtype = amp.amp_dtype(device, fp16=args.fp16)
    rows = run_table(
        args.sizes,
        args.batch_sizes,
        args.classes,
        device,
        args.repeats,
        args.full,
        args.est_images,
        args.max_bytes,
        amp_dtype,
    )
    precision = str(amp_dtype).replace("torch.", "") + " autocast" if amp_dtype else "fp32"
    print(
        f"SimOTA on {device} ({torch.get_num_threads()} threads), {precision}, {args.classes} classes, "
        "5-40 GTs padded to 120"
    )
    print(tabulate(rows, headers=table_headers(official_assigner() is not None), tablefmt="github"))
