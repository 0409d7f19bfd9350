"""Deployment: each export format and precision against PyTorch eager fp32, on this CPU, in one run.

    python tools/benchmark.py deploy                 # the README's shapes_nano run (best_ckpt.pth), 320 px
    python tools/benchmark.py deploy -f exps/example/finetune_nano.py -c runs/raccoon/best_ckpt.pth \\
        dataset ../shared/real/raccoon               # a fine-tuned COCO nano on real photos, 416 px
    python tools/benchmark.py deploy --formats openvino,onnx --runs 50

For each row the checkpoint is exported (tools/export.py's functions, dynamic batch, boxes decoded in
torch), read back as `tools/eval.py -c FILE` reads it and scored with the same evaluator on the exp's
validation split; then timed on letterboxed validation images: latency at batch 1 and throughput at
batch 8, each the median of `--runs` calls per round over `--rounds` rounds that interleave the rows (a
load change on a shared machine then hits every row alike), after `--warmup` calls. The time is the
model call as eval makes it (forward and, for raw outputs, the decode), not the letterbox or the NMS,
except in the "fp32+nms" rows: files exported with `--nms` (the exp's thresholds, at most 100 detections),
whose time includes the decode and NMS in their graph and whose AP is scored on their own detections.
INT8 rows are calibrated on `--calib-images` training images. Every row runs with torch's thread count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from loguru import logger
from tabulate import tabulate

from benchmarks.kit.measure import ratio, value_range
from yolox_fast.core.cli import add_exp_arguments, build_exp, parse_with_overrides
from yolox_fast.data.build import build_calibration_dataset, build_eval_dataset
from yolox_fast.export import (
    FORMATS,
    CalibrationImages,
    GraphNMS,
    export_file,
    export_metadata,
    exported_size,
    load_exported_model,
)
from yolox_fast.inference import load_inference_model

# (format, precision) in table order; pytorch fp32 is the baseline every ratio divides by
ROWS = (("pytorch", "fp32"), ("torchscript", "fp32"), ("onnx", "fp32"), ("onnx", "int8"),
        ("onnx", "fp32+nms"), ("openvino", "fp32"), ("openvino", "fp16"), ("openvino", "int8"),
        ("openvino", "fp32+nms"))  # fmt: skip
COMPARED = tuple(dict.fromkeys(fmt for fmt, _ in ROWS if fmt != "pytorch"))
SHAPES_EXP = Path(__file__).resolve().parents[2] / "exps" / "example" / "shapes_nano.py"


@dataclass
class Row:
    fmt: str
    precision: str
    model: Callable
    runs_in: str
    size_mib: float
    ap50_95: float = 0.0
    ap50: float = 0.0
    latency: list[float] = field(default_factory=list)  # per round: median s per batch-1 call
    throughput: list[float] = field(default_factory=list)  # per round: images/s at the big batch

    @property
    def call(self) -> Callable:
        """What one timed call runs: the model, or the detections of a file that ends in NMS."""
        nms = getattr(getattr(self.model, "metadata", None), "nms", None)
        return self.model.detect if nms else self.model


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("python tools/benchmark.py deploy")
    add_exp_arguments(p, "checkpoint; default: <output_dir>/<exp_name>/best_ckpt.pth (the training output)")
    p.add_argument(
        "--formats",
        default="torchscript,onnx,openvino",
        help="comma-separated formats to compare with PyTorch eager (default: all three)",
    )
    p.add_argument("--calib-images", type=int, default=300, help="training images INT8 calibrates on")
    p.add_argument("--batch-size", type=int, default=8, help="batch of the throughput column")
    p.add_argument("--runs", type=int, default=10, help="timed calls per row and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all rows")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per row before the rounds")
    p.add_argument("--out", default=None, help="folder for the exported files (default: a temporary one)")
    return p


def _median_call(model: Callable, images: torch.Tensor, runs: int) -> float:
    times = []
    with torch.no_grad():
        for _ in range(runs):
            start = time.perf_counter()
            model(images)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _export(fmt: str, row_precision: str, model, exp, class_names, folder: str, calibration) -> str:
    precision, _, nms = row_precision.partition("+")
    path = os.path.join(folder, f"{exp.exp_name}_{precision}{'_nms' if nms else ''}{FORMATS[fmt].suffix}")
    calibrated = calibration.num_images if precision == "int8" else 0
    graph_nms = GraphNMS(exp.test_conf, exp.nmsthre) if nms else None
    meta = export_metadata(exp, model, class_names, fmt, False, None, precision, "cpu", calibrated, graph_nms)
    export_file(model, path, meta, calibration=calibration if precision == "int8" else None)
    return path


def _score(exp, model, class_names, batch_size: int) -> tuple[float, float]:
    evaluator = exp.get_evaluator(batch_size, False)
    evaluator.class_names = class_names
    ap50_95, ap50, _ = evaluator.evaluate(model, False, False)
    return ap50_95, ap50


def main(argv=None) -> None:
    args = parse_with_overrides(make_parser(), argv)
    if not (args.exp_file or args.name):
        args.exp_file = str(SHAPES_EXP)
    exp = build_exp(args)
    ckpt = args.ckpt or os.path.join(exp.output_dir, exp.exp_name, "best_ckpt.pth")
    if not os.path.isfile(ckpt):
        exp_flag = f"-f {args.exp_file}" if args.exp_file else f"-n {args.name}"
        raise SystemExit(f"no checkpoint {ckpt}: train it (python tools/train.py {exp_flag}) or give -c")
    exp.prepare_dataset()
    model, class_names = load_inference_model(exp, ckpt, "cpu")
    formats = args.formats.split(",")
    unknown = set(formats) - set(COMPARED)
    if unknown:
        choices = ", ".join(COMPARED)
        raise SystemExit(f"--formats: unknown {', '.join(sorted(unknown))} (choose from {choices})")
    wanted = [(f, p) for f, p in ROWS if f == "pytorch" or f in formats]
    calibration = None
    if any(p == "int8" for _, p in wanted):
        calibration = CalibrationImages(build_calibration_dataset(exp), args.calib_images, 1)

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or tmp
        os.makedirs(folder, exist_ok=True)
        rows = _export_rows(wanted, model, exp, class_names, folder, calibration)
        _measure(rows, exp, class_names, args)


def _export_rows(wanted, model, exp, class_names, folder: str, calibration) -> list[Row]:
    """The PyTorch row and one per exported file (written into `folder`), each read back as eval reads it."""
    rows: list[Row] = []
    for fmt, precision in wanted:
        if fmt == "pytorch":
            size = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
            rows.append(Row(fmt, precision, model, "fp32", size))
            continue
        path = _export(fmt, precision, model, exp, class_names, folder, calibration)
        exported = load_exported_model(path)
        rows.append(Row(fmt, precision, exported, exported.runs_in, exported_size(path) / 2**20))
    return rows


def _measure(rows: list[Row], exp, class_names, args) -> None:
    """Score, time and print every row."""
    for row in rows:
        row.ap50_95, row.ap50 = _score(exp, row.model, class_names, args.batch_size)
        logger.info(f"{row.fmt} {row.precision}: AP50:95 {row.ap50_95:.4f}  AP50 {row.ap50:.4f}")

    val = build_eval_dataset(exp)
    big = torch.stack([torch.from_numpy(val[i % len(val)][0]) for i in range(args.batch_size)])
    one = big[:1].clone()
    for row in rows:
        for _ in range(args.warmup):
            with torch.no_grad():
                row.call(one), row.call(big)
    for round_index in range(args.rounds):
        for row in rows:
            # one untimed call first: the runtime that ran before may still hold the cores (spinning threads)
            with torch.no_grad():
                row.call(one), row.call(big)
            row.latency.append(_median_call(row.call, one, args.runs))
            row.throughput.append(args.batch_size / _median_call(row.call, big, args.runs))
        logger.info(f"timing round {round_index + 1}/{args.rounds} done")
    print_table(rows, exp, len(val), args)


def print_table(rows: list[Row], exp, num_val: int, args) -> None:
    base = rows[0]
    base_latency, base_throughput = statistics.median(base.latency), statistics.median(base.throughput)
    table = []
    for row in rows:
        latency, throughput = statistics.median(row.latency), statistics.median(row.throughput)
        table.append([
            row.fmt, row.precision, row.runs_in, f"{row.ap50_95:.4f}", f"{row.ap50:.4f}",
            f"{100 * (row.ap50_95 - base.ap50_95):+.2f}",
            f"{1000 * latency:.1f} ({1000 * min(row.latency):.1f}-{1000 * max(row.latency):.1f})",
            ratio(base_latency, latency),
            f"{throughput:.1f} ({value_range(row.throughput, 1)})", ratio(throughput, base_throughput),
            f"{row.size_mib:.1f}",
        ])  # fmt: skip
    int8 = [row.model.metadata.calibration_images for row in rows if row.precision == "int8"]
    calibrated = f", INT8 calibrated on {int8[0]} training images" if int8 else ""
    print(
        f"\ndeploy: {exp.exp_name} at {exp.test_size[0]}x{exp.test_size[1]}, {num_val} "
        f"val images, {torch.get_num_threads()} threads{calibrated}; times: median of {args.runs} calls x "
        f"{args.rounds} rounds (range over rounds)"
    )
    headers = ["format", "precision", "runs in", "AP50:95", "AP50", "dAP50:95 (pts)", "latency b1 ms",
               "vs eager", f"b{args.batch_size} img/s", "vs eager", "MiB"]  # fmt: skip
    print(tabulate(table, tablefmt="github", disable_numparse=True, headers=headers))
