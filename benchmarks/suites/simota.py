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
import time
from collections.abc import Sequence

import torch
from tabulate import tabulate

from benchmarks.kit.assigner import mib, official_assigner, run_table, table_headers
from benchmarks.kit.inputs import make_inputs  # the batches the tests check the assigner on
from benchmarks.kit.measure import CpuPeak, peak_bytes
from yolox_fast.models.simota import simota_assign
from yolox_fast.utils import amp
from yolox_fast.utils.metric import sync_device


def run_budget(device: torch.device, budget: int, num_classes: int) -> None:
    """N=256, 640 px, 120 GTs per image under a max_bytes budget: time and measured peak."""
    batch = make_inputs(256, 640, num_classes, min_gt=120, max_gt=120, device=device)
    cpu_peak = CpuPeak() if device.type == "cpu" else None
    t0 = time.perf_counter()
    result = simota_assign(**batch, max_bytes=budget)
    sync_device(device)
    seconds = time.perf_counter() - t0
    peak = peak_bytes(lambda: simota_assign(**batch, max_bytes=budget), device, cpu_peak)
    row = [256, 640, 120, mib(budget), f"{seconds:.2f}", mib(peak), f"{peak / budget:.2f}", result.num_fg]
    headers = ["N", "size", "GTs/img", "max_bytes MiB", "s/call", "peak MiB", "peak/budget", "num_fg"]
    print(tabulate([row], headers=headers, tablefmt="github"))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmark.py simota", description=__doc__.split("\n")[0])
    p.add_argument("--batch-sizes", "-n", type=int, nargs="+", default=[8, 32, 64, 256])
    p.add_argument("--sizes", type=int, nargs="+", default=[416, 640], help="square input sizes, px")
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--repeats", type=int, default=5, help="timed calls of the batched version (the fastest counts)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--full", action="store_true", help="time the CPU reference at N>=256 instead of estimating"
    )
    p.add_argument("--est-images", type=int, default=16, help="images timed to estimate a skipped reference")
    p.add_argument("--max-bytes", type=int, default=None, help="simota_assign budget (default: its own)")
    p.add_argument("--budget", action="store_true", help="only the N=256 / 640 px / 120 GTs budget check")
    p.add_argument("--budget-bytes", type=int, default=2**30)
    p.add_argument("--fp16", action="store_true", help="predictions in half precision, under autocast")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.budget:
        run_budget(device, args.budget_bytes, args.classes)
        return
    amp_dtype = amp.amp_dtype(device, fp16=args.fp16)
    rows = run_table(args.sizes, args.batch_sizes, args.classes, device, args.repeats, args.full,
                     args.est_images, args.max_bytes, amp_dtype)  # fmt: skip
    precision = str(amp_dtype).replace("torch.", "") + " autocast" if amp_dtype else "fp32"
    print(
        f"SimOTA on {device} ({torch.get_num_threads()} threads), {precision}, {args.classes} classes, "
        "5-40 GTs padded to 120"
    )
    print(tabulate(rows, headers=table_headers(official_assigner() is not None), tablefmt="github"))
