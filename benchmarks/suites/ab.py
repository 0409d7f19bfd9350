"""A/B: one change against its baseline in one run, the two sides alternated round by round (load from other
processes hits both alike; separate runs vary by more than these effects on a shared machine). Each row: the
median and range of `--repeats` rounds per side and the ratio of the change to the baseline.

    python tools/benchmark.py ab stem              # YOLOX-Nano, CPU: inference 416 px, training 320 px
    python tools/benchmark.py ab stem --batch 64 --repeats 12
    python tools/benchmark.py ab workers           # YOLOX-Nano, 320 px, batch 16, 2 workers, nice 19
    python tools/benchmark.py ab workers --nice 10 --repeats 12
    python tools/benchmark.py ab allocator         # YOLOX-Nano at 416 px, CPU
    python tools/benchmark.py ab allocator --repeats 5 --images 128

Each variant is also a suite of its own name: `python tools/benchmark.py stem` runs `ab stem`.

- stem: the Focus stem as one strided convolution of the image (what `models.Focus` runs) against YOLOX's
  way, the four pixel phases stacked and then convolved, with the same weights, in one process. Rows: the
  stem alone in inference (BatchNorm folded, as tools/eval.py runs it) and in training (its forward and
  backward: gradients of its weights, the image needs none), the whole model's forward (BatchNorm folded,
  in the exp's layout, NHWC by default) and a whole training step (forward, loss with SimOTA, backward, SGD
  step on random ground truth). Milliseconds of rounds of `--iters` calls; how far apart the sides' results
  are: the stem's outputs (largest difference against the largest value) and the first training loss (the
  whole model's random-weight outputs hardly depend on its input, so theirs would say nothing).
- workers: the training loader's workers at nice 0 against nice N (`data_worker_nice`, default 19 on a CPU,
  where the workers share the cores with the step's OpenMP threads): YOLOX-Nano steps (forward, loss with
  SimOTA, backward, SGD) on batches from two training loaders over the same generated set (mosaic, affine,
  HSV, flip; no cache), each with its own persistent workers; rounds of `--steps` iterations (the loader not
  in use holds its prefetched batches and takes no CPU). Seconds per iteration, data waiting included, as
  the trainer's iter_time; the model has its initial weights: the same work either way.
- allocator: inference with glibc keeping freed memory (`utils.allocator.keep_freed_memory`, what
  tools/demo.py and tools/eval.py do) against glibc's default. The setting is process-wide and cannot be
  undone (memory kept stays kept), so each side runs in a process of its own, started anew for every
  repeat. Each process, on the same generated images (BatchNorm folded, NHWC, random weights): the demo's
  batched Predictor (letterbox, forward, NMS) at -b 1 and -b `--batch`, images decoded beforehand, and
  `evaluator.evaluate` at -b `--batch` with `data_num_workers` 0 and `--workers`. Images/s (the best of
  `--rounds` rounds in the process; the median of those over the repeats), and the page faults of a round.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import subprocess
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
from tabulate import tabulate

from benchmarks.kit.commands import tool
from benchmarks.kit.fidelity_data import CLASS_NAMES, make_fidelity_set
from benchmarks.kit.measure import alternate, median_and_range, ratio, setting, timed
from benchmarks.kit.steps import step_inputs
from yolox_fast.exp import get_exp
from yolox_fast.models.network_blocks import Focus, fuse_model, space_to_depth

# row (None: the variant has one) -> side (the baseline first) -> the value of each round
Values = dict[str | None, dict[str, list[float]]]


def print_table(heading: str, headers: tuple[str, ...], values: Values, digits: int, rates: bool = False,
                middle=lambda row, side: [], after=lambda row, side: []) -> None:  # fmt: skip
    """`heading`, then per row and side [row, side, median, range, *middle(row, side), ratio to the baseline
    (`rates`: change over baseline, else times: baseline over change), *after(row, side)]."""
    rows = []
    for row, sides in values.items():
        base = statistics.median(next(iter(sides.values())))
        for side, repeats in sides.items():
            median = statistics.median(repeats)
            change = ratio(median, base) if rates else ratio(base, median)
            rows.append([*([] if row is None else [row]), side, *median_and_range(repeats, digits),
                         *middle(row, side), change, *after(row, side)])  # fmt: skip
    print(heading)
    print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))


# ------------------------------------------------------------------------------------------ stem
STEMS = ("phases, then conv", "strided conv")


class PhasesFocus(Focus):
    """YOLOX's stem as written: the space-to-depth copy, then the BaseConv."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(space_to_depth(x))


def with_phases_stem(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` (same weights) whose Focus stems stack the phases first."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if type(module) is Focus:
            module.__class__ = PhasesFocus
    return twin


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest elementwise difference of `a` and `b`, against the largest magnitude in `b`."""
    return float((a - b).abs().max() / b.abs().max())


def stem_cases(args) -> dict[str, tuple[dict[str, Callable[[], object]], float | None]]:
    """{row: ({side: one call}, how far apart the sides' results are (`relative_difference` of the stems'
    outputs, of the first losses), or None)}."""
    out: dict[str, tuple[dict[str, Callable[[], object]], float | None]] = {}

    # inference: the folded model and its stem, on the same images
    infer_args = types.SimpleNamespace(num_classes=args.num_classes, size=args.infer_size)
    model, test_imgs, _ = step_inputs(infer_args, args.batch, torch.device("cpu"))
    strided = fuse_model(model.eval()).to(memory_format=torch.channels_last)
    phases = with_phases_stem(strided)

    def inference(part: torch.nn.Module) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            with torch.no_grad():
                return part(test_imgs)

        return run

    stems = {side: inference(m.backbone.backbone.stem) for side, m in zip(STEMS, (phases, strided))}
    out["stem, inference"] = (stems, relative_difference(stems[STEMS[0]](), stems[STEMS[1]]()))
    # the whole model's random-weight outputs hardly depend on its input: their difference would say nothing
    out["model, inference"] = ({STEMS[0]: inference(phases), STEMS[1]: inference(strided)}, None)

    # training: the stem's forward + backward, and whole steps, from the same initial weights (step_inputs
    # gives the images in the trainer's layout)
    train_args = types.SimpleNamespace(num_classes=args.num_classes, size=args.train_size)
    model, imgs, targets = step_inputs(train_args, args.batch, torch.device("cpu"))
    train_models = {STEMS[0]: with_phases_stem(model), STEMS[1]: model}

    def stem_pass(m: torch.nn.Module) -> Callable[[], torch.Tensor]:
        stem = m.backbone.backbone.stem

        def run() -> torch.Tensor:
            y = stem(imgs)
            y.backward(torch.ones_like(y))
            return y.detach()

        return run

    passes = {side: stem_pass(m) for side, m in train_models.items()}
    out["stem, training"] = (passes, relative_difference(passes[STEMS[0]](), passes[STEMS[1]]()))

    def step(m: torch.nn.Module) -> Callable[[], float]:
        optimizer = torch.optim.SGD(m.parameters(), lr=1e-6, momentum=0.9, nesterov=True, foreach=True)

        def run() -> float:
            loss = m(imgs, targets)["total_loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss.item()

        return run

    first = [train_models[side](imgs, targets)["total_loss"].detach() for side in STEMS]
    steps = {side: step(m) for side, m in train_models.items()}
    out["model, training step"] = (steps, relative_difference(*first))
    return out


def stem_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--infer-size", type=int, default=416, help="inference size, px (nano's test size)")
    parser.add_argument("--train-size", type=int, default=320, help="training size, px")
    parser.add_argument("--num-classes", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3, help="calls per timed round")
    parser.add_argument("--repeats", type=int, default=8, help="timed rounds per side")


def stem(args) -> None:
    """Milliseconds per call of each row's sides, alternated row by row; the sides' difference after."""
    torch.manual_seed(0)
    values: Values = {}
    differences: dict[str, float | None] = {}
    for row, (runs, difference) in stem_cases(args).items():
        differences[row] = difference
        for run in runs.values():  # untimed: oneDNN's kernel choices, the first allocations
            run()
        seconds = alternate({side: timed(run, args.iters) for side, run in runs.items()}, args.repeats)
        values[row] = {side: [1000 * s for s in times] for side, times in seconds.items()}

    def difference(row: str, side: str) -> list[str]:
        shown = side == STEMS[1] and differences[row] is not None
        return [f"{differences[row]:.1e}" if shown else ""]

    heading = (
        f"YOLOX-Nano's Focus stem, batch {args.batch}, inference at {args.infer_size} px (BatchNorm folded), "
        f"training at {args.train_size} px, NHWC, {setting(torch.device('cpu'), None)}; median and range of "
        f"{args.repeats} alternating rounds of {args.iters} calls"
    )
    headers = ("what", "stem", "ms", "range", "vs phases", "relative difference")
    print_table(heading, headers, values, 1, after=difference)


# ------------------------------------------------------------------------------------------ workers
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


def workers_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nice", type=int, default=19, help="the niceness compared with 0")
    parser.add_argument("--size", type=int, default=320, help="training size, px")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="loader workers per loader")
    parser.add_argument("--images", type=int, default=208, help="generated training images")
    parser.add_argument("--steps", type=int, default=6, help="training iterations per timed round")
    parser.add_argument("--repeats", type=int, default=8, help="timed rounds per side")
    parser.add_argument("--out", default=None, help="folder of the generated set (default: a temporary one)")


def workers(args) -> None:
    """Seconds per training iteration (data waiting included) of each side's loader, alternated."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        dataset_json = make_fidelity_set(
            root / f"workers_{args.images}_{args.size}", args.images, 8, args.size
        )
        exps = {f"nice {n}": nano_exp(args, dataset_json, n) for n in (0, args.nice)}
        model = exps["nice 0"].get_model().to(memory_format=torch.channels_last).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, nesterov=True, foreach=True)
        batches = {name: iter(exp.get_data_loader(batch_size=args.batch, is_distributed=False))
                   for name, exp in exps.items()}  # fmt: skip

        def step(name: str) -> None:
            imgs, targets = next(batches[name])[:2]
            imgs = imgs.float().contiguous(memory_format=torch.channels_last)  # as the trainer's _next_batch
            loss = model(imgs, targets)["total_loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        for name in exps:  # untimed: workers start, first batches, oneDNN's kernel choices
            for _ in range(2):
                step(name)
        seconds = alternate(
            {name: timed(lambda name=name: step(name), args.steps) for name in exps}, args.repeats
        )
    heading = (
        f"YOLOX-Nano training iterations at {args.size} px, batch {args.batch}, "
        f"{setting(torch.device('cpu'), None)}, {args.workers} loader workers at nice 0 and at nice "
        f"{args.nice}; median and range of {args.repeats} alternating rounds of {args.steps} iterations"
    )
    rates = {name: f"{args.batch / statistics.median(values):.1f}" for name, values in seconds.items()}
    headers = ("workers", "s/iter", "range", "img/s", "vs nice 0")
    print_table(heading, headers, {None: seconds}, 3, middle=lambda _, side: [rates[side]])


# ------------------------------------------------------------------------------------------ allocator
ALLOCATORS = ("default", "kept")


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


def measure_allocator_side(args) -> dict[str, tuple[float, int]]:
    """In this process: {row: (images/s, page faults of a round)} with the allocator as `args.side` says."""
    import cv2
    from loguru import logger

    from yolox_fast.core.demo import DEMO_CONF, DEMO_NMS, list_images
    from yolox_fast.inference import Predictor
    from yolox_fast.utils.allocator import keep_freed_memory

    if args.side == "kept" and not keep_freed_memory():
        raise SystemExit("glibc's mallopt is not available here: nothing to compare")
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


def run_allocator_side(args, side: str, dataset: Path) -> dict[str, tuple[float, int]]:
    """`measure_allocator_side` in a fresh process."""
    cmd = tool("benchmark", "ab", "allocator", "--side", side, "--dataset", dataset, "--size", args.size,
               "--batch", args.batch, "--workers", args.workers, "--rounds", args.rounds)  # fmt: skip
    cmd += ["--threads", str(args.threads)] if args.threads else []
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def allocator_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=416, help="test size, px (nano's)")
    parser.add_argument("--images", type=int, default=64, help="generated validation images")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="evaluation loader workers of the second row")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per process; the best counts")
    parser.add_argument("--repeats", type=int, default=3, help="processes per side, alternated")
    parser.add_argument("--out", default=None, help="folder of the generated images (default: temporary)")
    parser.add_argument("--side", choices=ALLOCATORS, help=argparse.SUPPRESS)  # a side's own process
    parser.add_argument("--dataset", help=argparse.SUPPRESS)


def allocator(args) -> None:
    """Images/s of each row, the sides' fresh processes alternated; in a side's process (--side), its JSON."""
    if args.side:
        print(json.dumps(measure_allocator_side(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        dataset = make_fidelity_set(root / f"allocator_{args.images}_{args.size}", 0, args.images, args.size)
        sides = {side: lambda side=side: run_allocator_side(args, side, dataset) for side in ALLOCATORS}
        runs = alternate(sides, args.repeats)  # side -> per process {row: (images/s, page faults)}
    rows = runs[ALLOCATORS[0]][0]
    values = {row: {side: [r[row][0] for r in runs[side]] for side in ALLOCATORS} for row in rows}
    heading = (
        f"YOLOX-Nano at {args.size} px on the CPU, {args.images} generated images, BatchNorm folded, NHWC: "
        f"glibc keeping freed memory against its default; median and range over {args.repeats} processes per "
        f"side (alternated) of the best of {args.rounds} rounds in each"
    )
    headers = ("task", "allocator", "img/s", "range", "page faults a round", "vs default")

    def page_faults(row: str, side: str) -> list[str]:
        return [f"{statistics.median(r[row][1] for r in runs[side]):.0f}"]

    print_table(heading, headers, values, 1, rates=True, middle=page_faults)


# variant -> (its flags, the measurement, which prints its table, what it measures)
VARIANTS = {
    "stem": (stem_arguments, stem, "the Focus stem as one strided conv vs phases stacked, then the conv"),
    "workers": (workers_arguments, workers, "training iterations, the loader workers at nice 0 vs nice 19"),
    "allocator": (allocator_arguments, allocator, "demo and evaluation, glibc keeping freed memory or not"),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        "python tools/benchmark.py ab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    variants = parser.add_subparsers(dest="variant", required=True, metavar="{" + ",".join(VARIANTS) + "}")
    for name, (add_arguments, _, summary) in VARIANTS.items():
        sub = variants.add_parser(name, help=summary, description=summary)
        add_arguments(sub)
        sub.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    VARIANTS[args.variant][1](args)
