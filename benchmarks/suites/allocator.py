"""Inference with glibc keeping freed memory (`utils.allocator.keep_freed_memory`, what tools/demo.py and
tools/eval.py do) against glibc's default, in fresh processes alternated.

    python tools/benchmark.py allocator                   # YOLOX-Nano at 416 px, CPU
    python tools/benchmark.py allocator --repeats 5 --images 128

The setting is process-wide and cannot be undone (memory kept stays kept), so each side runs in a process
of its own, started anew for every repeat and alternated with the other side's (load from other processes
hits both alike). Each process, on the same generated images (BatchNorm folded, NHWC, random weights):

- demo: the batched Predictor (letterbox, forward, NMS) at -b 1 and -b `--batch`, images decoded beforehand;
- evaluation: `evaluator.evaluate` at -b `--batch` with `data_num_workers` 0 and `--workers`.

Each row: images/s (the best of `--rounds` rounds in the process; the median of those over the repeats), the
range over the repeats, the page faults of one round, and the ratio of kept to default.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from benchmarks.kit.fidelity_data import CLASS_NAMES, make_fidelity_set
from benchmarks.kit.measure import alternate, value_range

TOOLS = Path(__file__).resolve().parents[2] / "tools"
SIDES = ("default", "kept")


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def best_round(run, rounds: int) -> tuple[float, int]:
    """(the best images/s of `rounds` calls of `run`, which returns images/s; that round's page faults)."""
    best = (0.0, 0)
    for _ in range(rounds):
        before = faults()
        rate = run()
        best = max(best, (rate, faults() - before))
    return best


def measure_side(args) -> dict[str, tuple[float, int]]:
    """In this process: {row: (images/s, page faults of a round)} with the allocator as `args.side` says."""
    import cv2
    import torch
    from loguru import logger

    from yolox_fast.core.demo import DEMO_CONF, DEMO_NMS, list_images
    from yolox_fast.exp import get_exp
    from yolox_fast.inference import Predictor
    from yolox_fast.models.network_blocks import fuse_model
    from yolox_fast.utils.allocator import keep_freed_memory

    if args.side == "kept" and not keep_freed_memory():
        raise SystemExit("glibc's mallopt is not available here: nothing to compare")
    if args.threads:
        torch.set_num_threads(args.threads)
    logger.remove()
    exp = get_exp(exp_name="yolox-nano")
    exp.merge(["dataset", args.dataset, "num_classes", str(len(CLASS_NAMES)), "test_size",
               f"({args.size},{args.size})"])  # fmt: skip
    exp.validate()
    exp.prepare_dataset()
    torch.manual_seed(0)
    model = fuse_model(exp.get_model().eval()).to(memory_format=torch.channels_last)
    root = Path(args.dataset).parent
    images = [cv2.imread(str(path)) for path in list_images(str(root / "val2017"))]
    predictor = Predictor(model, len(CLASS_NAMES), exp.test_size, DEMO_CONF, DEMO_NMS, torch.device("cpu"),
                          channels_last=True)  # fmt: skip

    def demo(batch: int):
        def run() -> float:
            t0 = time.perf_counter()
            for i in range(0, len(images), batch):
                predictor.predict(images[i : i + batch])
            return len(images) / (time.perf_counter() - t0)

        return run

    def evaluation(workers: int):
        exp.data_num_workers = workers
        evaluator = exp.get_evaluator(args.batch, False)

        def run() -> float:
            t0 = time.perf_counter()
            evaluator.evaluate(model)
            return len(images) / (time.perf_counter() - t0)

        return run

    rows = {"demo, -b 1": demo(1), f"demo, -b {args.batch}": demo(args.batch),
            f"evaluation, -b {args.batch}, 0 workers": evaluation(0),
            f"evaluation, -b {args.batch}, {args.workers} workers": evaluation(args.workers)}  # fmt: skip
    for run in rows.values():  # untimed: oneDNN's kernel choices, the first batches' memory
        run()
    return {name: best_round(run, args.rounds) for name, run in rows.items()}


def run_side(args, side: str, dataset: Path) -> dict[str, tuple[float, int]]:
    """`measure_side` in a fresh process."""
    cmd = [sys.executable, str(TOOLS / "benchmark.py"), "allocator", "--side", side, "--dataset",
           str(dataset), "--size", str(args.size), "--batch", str(args.batch), "--workers", str(args.workers),
           "--rounds", str(args.rounds)]  # fmt: skip
    cmd += ["--threads", str(args.threads)] if args.threads else []
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser("python tools/benchmark.py allocator")
    parser.add_argument("--size", type=int, default=416, help="test size, px (nano's)")
    parser.add_argument("--images", type=int, default=64, help="generated validation images")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="evaluation loader workers of the second row")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per process; the best counts")
    parser.add_argument("--repeats", type=int, default=3, help="processes per side, alternated")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", default=None, help="folder of the generated images (default: temporary)")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a side's own process
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(measure_side(args)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        dataset = make_fidelity_set(root / f"allocator_{args.images}_{args.size}", 0, args.images, args.size)
        sides = {side: lambda side=side: run_side(args, side, dataset) for side in SIDES}
        runs = alternate(sides, args.repeats)
    rows = []
    for name in runs["default"][0]:
        base = statistics.median(r[name][0] for r in runs["default"])
        for side in SIDES:
            rates = [r[name][0] for r in runs[side]]
            round_faults = statistics.median(r[name][1] for r in runs[side])
            rows.append([name, side, f"{statistics.median(rates):.1f}", value_range(rates, 1),
                         f"{round_faults:.0f}", f"{statistics.median(rates) / base:.2f}x"])  # fmt: skip
    print(
        f"YOLOX-Nano at {args.size} px on the CPU, {args.images} generated images, BatchNorm folded, NHWC: "
        f"glibc keeping freed memory against its default; median and range over {args.repeats} processes per "
        f"side (alternated) of the best of {args.rounds} rounds in each"
    )
    print(tabulate(rows, headers=["task", "allocator", "img/s", "range", "page faults a round", "vs default"],
                   tablefmt="github", disable_numparse=True))  # fmt: skip
