"""Demo throughput: images/s of the batched Predictor (letterbox + forward + NMS) at several batch sizes.

    python tools/benchmark.py demo                       # nano at 416 on CPU, batch 1 vs 8 vs 32
    python tools/benchmark.py demo --device gpu --fp16 --exp yolox-s --tsize 640

Each batch size runs in the default NCHW layout and in channels_last (and with --compile, a torch.compile'd
copy in the last layout, its graphs built before the rounds and their time printed apart). All settings run
in the same process on the same images, interleaved over several rounds, and the best round of each is
reported (other processes only ever slow a round down), so the speed-up column compares like with like even
on a machine whose load changes; the range column shows the spread. Weights are random (throughput does
not depend on them, except for the NMS share).

"GFLOP/s" is the model's counted forward FLOPs per image at tsize x tsize (`benchmarks.kit.peak`) times the
end-to-end images/s (letterbox and NMS included, so it is a lower bound for the network alone); "of peak"
divides it by the matmul / 3x3-conv peak measured in the same run on the same device and threads.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence

import numpy as np
import torch
from loguru import logger
from tabulate import tabulate

from benchmarks.kit.measure import alternate, ratio, value_range
from benchmarks.kit.peak import achieved_columns, forward_flops_per_image, measured_peak, peak_line
from yolox_fast.exp import get_exp
from yolox_fast.inference import Predictor
from yolox_fast.models.network_blocks import fuse_model
from yolox_fast.utils.amp import amp_dtype
from yolox_fast.utils.compile import MODES


def make_images(n: int, seed: int = 0) -> list[np.ndarray]:
    """`n` random BGR images of camera-like sizes (480x640 and 720x1280 alternating)."""
    rng = np.random.default_rng(seed)
    sizes = [(480, 640, 3), (720, 1280, 3)]
    return [rng.integers(0, 256, sizes[i % 2], dtype=np.uint8) for i in range(n)]


def images_per_second(predictor: Predictor, images: Sequence[np.ndarray], batch_size: int) -> float:
    """End-to-end throughput over `images` in batches of `batch_size`."""
    start = time.perf_counter()
    for i in range(0, len(images), batch_size):
        predictor.predict(list(images[i : i + batch_size]))
    return len(images) / (time.perf_counter() - start)


def main(argv=None) -> None:
    p = argparse.ArgumentParser("python tools/benchmark.py demo")
    p.add_argument("--exp", default="yolox-nano", help="model name (-n of the tools)")
    p.add_argument("--tsize", type=int, default=416)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--images", type=int, default=32, help="images per round (rounded up to whole batches)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all settings; the best is shown")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--fuse", action="store_true")
    p.add_argument("--no-channels-last", action="store_true", help="measure the default NCHW layout only")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also a torch.compile'd copy (inductor, a static graph per batch size) in the last layout; its "
        "compile time is printed apart",
    )
    p.add_argument("--compile-mode", choices=MODES, default="default")
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "gpu" else "cpu")
    exp = get_exp(exp_name=args.exp)
    model = exp.get_model().eval()
    if args.fuse:
        model = fuse_model(model)
    model.to(device)
    layouts = ["NCHW"] if args.no_channels_last else ["NCHW", "channels_last"]

    def predictor(net: torch.nn.Module, layout: str) -> Predictor:
        size, dtype = (args.tsize, args.tsize), amp_dtype(device, fp16=args.fp16)
        return Predictor(net, exp.num_classes, size, 0.3, 0.45, device, dtype, layout == "channels_last")

    predictors = {layout: predictor(model, layout) for layout in layouts}
    compiled_line = ""
    if args.compile:
        name = f"{layouts[-1]}, compiled"
        predictors[name] = predictor(copy.deepcopy(model), layouts[-1])
        stats = predictors[name].compile(args.compile_mode, args.batch_sizes)
        compiled_line = f"torch.compile (inductor, mode {args.compile_mode}): {stats}, not in the rows\n"
        layouts.append(name)
    step = max(args.batch_sizes)
    images = make_images(-(-args.images // step) * step)
    logger.info(
        f"{args.exp} at {args.tsize}, {len(images)} images x {args.rounds} rounds per setting, "
        f"device {device}, {torch.get_num_threads()} CPU threads, fp16 {args.fp16}, fuse {args.fuse}"
    )

    settings = [(layout, b) for layout in layouts for b in args.batch_sizes]
    for layout, b in settings:  # warm-up: oneDNN picks and caches kernels per shape and layout
        predictors[layout].model.to(memory_format=predictors[layout].memory_format)
        predictors[layout].predict(images[:b])

    def measure(layout: str, b: int):
        def run() -> float:
            # the uncompiled predictors share one model: put it in this setting's memory format
            predictors[layout].model.to(memory_format=predictors[layout].memory_format)
            return images_per_second(predictors[layout], images, b)

        return run

    runs = alternate({s: measure(*s) for s in settings}, args.rounds)
    dtype = amp_dtype(device, fp16=args.fp16)
    flops = forward_flops_per_image(model, (args.tsize, args.tsize), device, dtype)
    peak = measured_peak(device, dtype)
    base = max(runs[settings[0]])
    rows = []
    for layout, b in settings:
        ips = max(runs[(layout, b)])
        rows.append((layout, b, f"{ips:.1f}", value_range(runs[(layout, b)], 1), f"{1000 / ips:.1f}",
                     ratio(ips, base), *achieved_columns(flops, ips, peak)))  # fmt: skip
    headers = ("layout", "batch", "images/s", "range", "ms/image", f"vs NCHW batch {args.batch_sizes[0]}",
               "GFLOP/s", "of peak")  # fmt: skip
    print(compiled_line + f"{flops / 1e9:.2f} GFLOPs per image forward; " + peak_line(peak, str(device)))
    print(tabulate(rows, headers=headers))


if __name__ == "__main__":
    main()
