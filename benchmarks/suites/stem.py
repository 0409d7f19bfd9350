"""The Focus stem as one strided convolution of the image (what `models.Focus` runs) against YOLOX's way,
the four pixel phases stacked and then convolved, in one process, the two alternated round by round.

    python tools/benchmark.py stem                    # YOLOX-Nano, CPU: inference 416 px, training 320 px
    python tools/benchmark.py stem --batch 64 --repeats 12

Rows, each side with the same weights:
- stem, inference: the stem alone (BatchNorm folded, as tools/eval.py runs it) on a batch of images;
- stem, training: its forward and backward (gradients of its weights; the image needs none);
- model, inference: the whole model's forward, BatchNorm folded, in the exp's layout (NHWC by default);
- model, training step: forward, loss with SimOTA, backward and SGD step on random ground truth.
Milliseconds (median and range of `--repeats` rounds of `--iters` calls) and the ratio of the phases side's
time to the strided side's; how far apart the two sides' results are: the stem's outputs (largest difference
against the largest value) and the first training loss (the whole model's random-weight outputs hardly depend
on its input, so theirs would say nothing).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import types
from collections.abc import Callable

import torch
from tabulate import tabulate

from benchmarks.kit.measure import alternate, setting, value_range
from benchmarks.kit.steps import step_inputs
from yolox_fast.models.network_blocks import Focus, fuse_model, space_to_depth

SIDES = ("phases, then conv", "strided conv")


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


def timed(run: Callable[[], object], iters: int) -> Callable[[], float]:
    def measure() -> float:
        t0 = time.perf_counter()
        for _ in range(iters):
            run()
        return (time.perf_counter() - t0) / iters * 1000

    return measure


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest elementwise difference of `a` and `b`, against the largest magnitude in `b`."""
    return float((a - b).abs().max() / b.abs().max())


def cases(args) -> dict[str, tuple[dict[str, Callable[[], object]], float | None]]:
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

    stems = {
        SIDES[0]: inference(phases.backbone.backbone.stem),
        SIDES[1]: inference(strided.backbone.backbone.stem),
    }
    out["stem, inference"] = (stems, relative_difference(stems[SIDES[0]](), stems[SIDES[1]]()))
    # the whole model's random-weight outputs hardly depend on its input: their difference would say nothing
    out["model, inference"] = ({SIDES[0]: inference(phases), SIDES[1]: inference(strided)}, None)

    # training: the stem's forward + backward, and whole steps, from the same initial weights (step_inputs
    # gives the images in the trainer's layout)
    train_args = types.SimpleNamespace(num_classes=args.num_classes, size=args.train_size)
    model, imgs, targets = step_inputs(train_args, args.batch, torch.device("cpu"))
    train_models = {SIDES[0]: with_phases_stem(model), SIDES[1]: model}

    def stem_pass(m: torch.nn.Module) -> Callable[[], torch.Tensor]:
        stem = m.backbone.backbone.stem

        def run() -> torch.Tensor:
            y = stem(imgs)
            y.backward(torch.ones_like(y))
            return y.detach()

        return run

    stem_passes = {side: stem_pass(m) for side, m in train_models.items()}
    out["stem, training"] = (
        stem_passes,
        relative_difference(stem_passes[SIDES[0]](), stem_passes[SIDES[1]]()),
    )

    def step(m: torch.nn.Module) -> Callable[[], float]:
        optimizer = torch.optim.SGD(m.parameters(), lr=1e-6, momentum=0.9, nesterov=True, foreach=True)

        def run() -> float:
            loss = m(imgs, targets)["total_loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss.item()

        return run

    first = [train_models[side](imgs, targets)["total_loss"].detach() for side in SIDES]
    out["model, training step"] = (
        {side: step(m) for side, m in train_models.items()},
        relative_difference(*first),
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser("python tools/benchmark.py stem")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--infer-size", type=int, default=416, help="inference size, px (nano's test size)")
    parser.add_argument("--train-size", type=int, default=320, help="training size, px")
    parser.add_argument("--num-classes", type=int, default=4)
    parser.add_argument("--iters", type=int, default=3, help="calls per timed round")
    parser.add_argument("--repeats", type=int, default=8, help="timed rounds per side")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    rows = []
    for row, (runs, difference) in cases(args).items():
        for run in runs.values():  # untimed: oneDNN's kernel choices, the first allocations
            run()
        times = alternate({side: timed(run, args.iters) for side, run in runs.items()}, args.repeats)
        base = statistics.median(times[SIDES[0]])
        for side in SIDES:
            median = statistics.median(times[side])
            shown = f"{difference:.1e}" if side == SIDES[1] and difference is not None else ""
            ratio = f"{base / median:.2f}x"
            rows.append([row, side, f"{median:.1f}", value_range(times[side], 1), ratio, shown])
    print(
        f"YOLOX-Nano's Focus stem, batch {args.batch}, inference at {args.infer_size} px (BatchNorm folded), "
        f"training at {args.train_size} px, NHWC, {setting(torch.device('cpu'), None)}; median and range of "
        f"{args.repeats} alternating rounds of {args.iters} calls"
    )
    headers = ["what", "stem", "ms", "range", "vs phases", "relative difference"]
    print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))


if __name__ == "__main__":
    main()
