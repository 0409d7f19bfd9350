"""Training loader workers' priority: iterations with the workers at nice 0 against nice N.

    python tools/benchmark.py workers                 # YOLOX-Nano, 320 px, batch 16, 2 workers, nice 19
    python tools/benchmark.py workers --nice 10 --repeats 12

On a CPU the loader workers share the cores with the step's OpenMP threads; `data_worker_nice` (default:
19 on a CPU) lowers their priority. This measures what that changes, in one process, the two sides
alternated round by round (load from other processes hits both alike; separate runs of tools/train.py vary
by more than the effect on a shared machine): YOLOX-Nano steps (forward, loss with SimOTA, backward, SGD) on
batches from two training loaders over the same generated set (mosaic, affine, HSV, flip; no cache), one
with its workers at nice 0 and one at `--nice`, each with its own persistent workers; rounds of `--steps`
iterations alternate between them (the loader not in use holds its prefetched batches and takes no CPU).
Seconds per iteration, data waiting included, as the trainer's iter_time. The model has its initial
weights: what is timed is the same work either way.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tabulate import tabulate

from benchmarks.kit.fidelity_data import CLASS_NAMES, make_fidelity_set
from benchmarks.kit.measure import alternate, setting, value_range
from yolox_fast.exp import get_exp


def nano_exp(args, dataset_json: Path, nice: int):
    """YOLOX-Nano on a generated set, at the benchmark's sizes, its loader workers at `nice`."""
    exp = get_exp(exp_name="yolox-nano")
    exp.merge(["dataset", str(dataset_json), "num_classes", str(len(CLASS_NAMES)),
               "input_size", f"({args.size},{args.size})", "test_size", f"({args.size},{args.size})",
               "multiscale_range", "0", "mosaic_prob", "0.5", "enable_mixup", "False",
               "data_num_workers", str(args.workers), "seed", "0",
               "data_worker_nice", str(nice)])  # fmt: skip
    exp.validate()
    exp.prepare_dataset()
    return exp


def measure_training(args, exps: dict[str, object]) -> dict[str, list[float]]:
    """Seconds per training iteration (data waiting included) of each side's loader, alternated."""
    first = next(iter(exps.values()))
    model = first.get_model().to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True, foreach=True)
    batches = {name: iter(exp.get_data_loader(batch_size=args.batch, is_distributed=False))
               for name, exp in exps.items()}  # fmt: skip

    def steps(name: str, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            imgs, targets = next(batches[name])[:2]
            imgs = imgs.float().contiguous(memory_format=torch.channels_last)  # as the trainer's _next_batch
            loss = model(imgs, targets)["total_loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return (time.perf_counter() - t0) / n

    for name in exps:  # untimed: workers start, first batches, oneDNN's kernel choices
        steps(name, 2)
    return alternate({name: lambda name=name: steps(name, args.steps) for name in exps}, args.repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser("python tools/benchmark.py workers")
    parser.add_argument("--nice", type=int, default=19, help="the niceness compared with 0")
    parser.add_argument("--size", type=int, default=320, help="training size, px")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="loader workers per loader")
    parser.add_argument("--images", type=int, default=208, help="generated training images")
    parser.add_argument("--steps", type=int, default=6, help="training iterations per timed round")
    parser.add_argument("--repeats", type=int, default=8, help="timed rounds per side")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", default=None, help="folder of the generated set (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        dataset_json = make_fidelity_set(
            root / f"workers_{args.images}_{args.size}", args.images, 8, args.size
        )
        exps = {f"nice {n}": nano_exp(args, dataset_json, n) for n in (0, args.nice)}
        runs = measure_training(args, exps)

    base = statistics.median(runs["nice 0"])
    rows = []
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        rows.append([name, f"{median:.3f}", value_range(seconds, 3), f"{args.batch / median:.1f}",
                     f"{base / median:.2f}x"])  # fmt: skip
    print(
        f"YOLOX-Nano training iterations at {args.size} px, batch {args.batch}, "
        f"{setting(torch.device('cpu'), None)}, {args.workers} loader workers at nice 0 and at nice "
        f"{args.nice}; median and range of {args.repeats} alternating rounds of {args.steps} iterations"
    )
    headers = ["workers", "s/iter", "range", "img/s", "vs nice 0"]
    print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
