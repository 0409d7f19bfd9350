"""Evaluate a checkpoint on the exp's validation split (COCO AP or VOC mAP, by the dataset's format).

python tools/eval.py -n yolox-s -c yolox_s.pth -b 64 --conf 0.001 --fuse
python tools/eval.py -f exps/yolox_nano.py -b 8 -d 2                       # 2 processes
torchrun --nproc_per_node 8 tools/eval.py -n yolox-m -c yolox_m.pth -b 64    # under torchrun
python tools/eval.py -n yolox-s -c yolox_s.pth --speed                     # timing only
python tools/eval.py -c shapes_nano.onnx -b 8                    # an exported file (or .torchscript)

Besides the printed AP, the per-class table, confusion matrix, PR / F1 curves and the detections
json go to <output_dir>/<exp_name>/eval/ (or --save-dir); see yolox_fast/evaluators/report.py.
"""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass

import torch
from loguru import logger

from yolox_fast.core.cli import (
    add_exp_arguments,
    add_inference_arguments,
    add_launch_arguments,
    build_exp,
    parse_with_overrides,
    run_tool,
)
from yolox_fast.core.launch import launch
from yolox_fast.evaluators.detection_evaluator import batch_sizes
from yolox_fast.evaluators.report import log_eval_report, write_eval_report
from yolox_fast.export import ExportedModel, exported_format, load_exported_model
from yolox_fast.inference import detect_batch, load_inference_model, model_device, model_memory_format
from yolox_fast.utils import dist as dist_utils
from yolox_fast.utils.allocator import keep_freed_memory
from yolox_fast.utils.amp import amp_dtype
from yolox_fast.utils.compile import compile_for_inference
from yolox_fast.utils.logger import setup_logger


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("yolox_fast eval")
    add_exp_arguments(
        p,
        "checkpoint (ours, which stores its exp, or official YOLOX's) or a file tools/export.py wrote "
        "(.onnx, .xml, .torchscript); -f/-n is optional but for official weights; default: "
        "<output_dir>/<exp_name>/best_ckpt.pth",
    )
    p.add_argument("-b", "--batch-size", type=int, default=64, help="total batch size over all processes")
    add_launch_arguments(p, devices=1)
    p.add_argument("--conf", type=float, default=None, help="score threshold (exp.test_conf)")
    p.add_argument("--nms", type=float, default=None, help="NMS IoU threshold (exp.nmsthre)")
    p.add_argument("--tsize", type=int, default=None, help="square test size (exp.test_size)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--fp16", action="store_true", help="half precision: fp16 on CUDA, bf16 on CPU")
    add_inference_arguments(p)
    p.add_argument("--legacy", action="store_true", help="accepted for YOLOX compatibility; no effect")
    p.add_argument(
        "--test",
        action="store_true",
        help="COCO test-dev: write the result json for the server instead of scoring (the exp's dataset "
        "description must name the test-dev images and image-info json as its val split)",
    )
    p.add_argument("--speed", action="store_true", help="time inference and NMS only")
    p.add_argument(
        "--report-conf", type=float, default=None, help="confidence of the per-class P/R (exp.report_conf)"
    )
    p.add_argument("--cm-conf", type=float, default=None, help="confusion matrix confidence (exp.cm_conf)")
    p.add_argument("--cm-iou", type=float, default=None, help="confusion matrix IoU (exp.cm_iou)")
    p.add_argument(
        "--save-dir", type=str, default=None, help="where the report files go (default <output>/<exp>/eval)"
    )
    return p


@dataclass(frozen=True)
class EvalMetrics:
    """What an evaluation measured, the same on every rank: COCO AP50:95 and AP50 (VOC: the mean over IoU
    0.50:0.95 and AP50), `per_class` {class name: {"AP50_95": ..., "AP50": ...}} (nan for a class without
    ground truth; empty for --speed and --test) and the printed summary."""

    ap50_95: float
    ap50: float
    per_class: dict[str, dict[str, float]]
    summary: str


def per_class_metrics(result: dict, class_names) -> dict[str, dict[str, float]]:
    """{name: {"AP50_95", "AP50"}} from an evaluator's `last_result` (its "per_class": metric -> list over
    the contiguous classes)."""
    table = result.get("per_class") or {}
    metrics = [m for m in ("AP50_95", "AP50") if m in table]
    return {name: {m: float(table[m][c]) for m in metrics} for c, name in enumerate(class_names)}


def evaluate(args, exp=None) -> EvalMetrics:
    """Run in every process of the job; returns its metrics (the same on every rank). `exp`: an exp object in
    place of -f/-n (the Python API's)."""
    device = dist_utils.local_device()
    exported = load_exported_model(args.ckpt, device) if exported_format(args.ckpt) else None
    exp = build_eval_exp(args, exported, exp)
    rank = dist_utils.get_rank()
    world = dist_utils.get_world_size()
    save_dir = os.path.join(exp.output_dir, exp.exp_name)
    setup_logger(save_dir, distributed_rank=rank, filename="val_log.txt")
    if args.legacy:
        logger.info("--legacy has no effect: yolox_fast inputs are always BGR 0-255 without normalisation")
    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
    if world > 1 and args.batch_size % world:
        raise ValueError(f"batch size {args.batch_size} is not divisible by the {world} processes")
    # every batch reuses the last one's memory instead of faulting it in anew (1.21x with 0 loader workers,
    # 1.26x with 2 on a 2-core CPU, `python tools/benchmark.py allocator`); the eval loader's workers fork
    # once, as the evaluation starts (they persist), so no later batch's pages are shared with them
    keep_freed_memory()

    if exported is not None:
        model, class_names = exported, exported.metadata.class_names
    else:
        ckpt = args.ckpt or os.path.join(save_dir, "best_ckpt.pth")
        if args.speed and args.ckpt is None and not os.path.isfile(ckpt):
            ckpt = None  # timing does not need trained weights (load_inference_model warns)
        model, class_names = load_inference_model(
            exp, ckpt, device, args.fuse, exp.channels_last, random_weights=args.speed
        )
    logger.info(
        f"exp {exp.exp_name}: test size {exp.test_size}, conf {exp.test_conf}, nms {exp.nmsthre}, "
        f"{world} process(es), batch {args.batch_size // world} per process, device {model_device(model)}"
    )

    exp.prepare_dataset()
    evaluator = exp.get_evaluator(args.batch_size // world, world > 1)
    if args.test:
        if not hasattr(evaluator, "testdev"):
            raise ValueError("--test (COCO test-dev) needs a COCO-format dataset")
        evaluator.testdev = True
        evaluator.testdev_json = os.path.join(save_dir, "yolox_testdev_2017.json")
    evaluator.class_names = class_names
    if exp.compile:
        compile_eval_model(model, exp, evaluator, args.fp16)
    ap50_95, ap50, summary = evaluator.evaluate(model, world > 1, args.fp16, speed_only=args.speed)
    logger.info("\n" + summary)
    if not (args.speed or args.test):
        logger.info(f"AP50:95 {ap50_95:.4f}  AP50 {ap50:.4f}")
        report_dir = args.save_dir or os.path.join(save_dir, "eval")
        report = write_eval_report(evaluator, exp, report_dir)  # None on ranks other than 0
        if report is not None:
            log_eval_report(report, report_dir)
    per_class = {} if args.speed or args.test else per_class_metrics(evaluator.last_result, class_names)
    return EvalMetrics(ap50_95, ap50, per_class, summary)


def compile_eval_model(model, exp, evaluator, half: bool) -> None:
    """torch.compile `model` and build its graphs for the loader's batch sizes before the timed evaluation."""
    (h, w), device, layout = exp.test_size, model_device(model), model_memory_format(model)
    dtype = amp_dtype(device, fp16=half)

    def warm_up(batch: int) -> None:
        imgs = torch.zeros(batch, 3, h, w, device=device).contiguous(memory_format=layout)
        sizes = [(h, w)] * batch
        detect_batch(model, imgs, sizes, (h, w), exp.num_classes, exp.test_conf, exp.nmsthre, dtype)

    sizes = batch_sizes(evaluator.dataloader)
    compile_for_inference(model, exp.compile_mode, warm_up, sizes, exp.compile_backend)


def build_eval_exp(args, exported: ExportedModel | None = None, exp=None):
    """The exp of -f/-n (optional with an `exported` file or a checkpoint of ours: see build_exp; `exp`, an
    exp object, replaces them) with the trailing overrides and the command-line thresholds applied."""
    if exported is not None and (args.fp16 or args.compile or args.channels_last):
        raise ValueError(
            f"--fp16, --channels-last and --compile are for checkpoints: {args.ckpt}'s precision, layers and "
            "layout are fixed at export"
        )
    exp = build_exp(args, exported.metadata if exported is not None else None, exp)
    if args.conf is not None:
        exp.test_conf = args.conf
    if args.nms is not None:
        exp.nmsthre = args.nms
    for flag in ("report_conf", "cm_conf", "cm_iou"):
        if getattr(args, flag) is not None:
            setattr(exp, flag, getattr(args, flag))
    exp.validate()
    return exp


def main(argv=None) -> EvalMetrics | None:
    """Evaluate as the command line `argv` says; returns the metrics when it ran in this one process."""
    args = parse_with_overrides(make_parser(), argv)
    # fail here, once, on a bad -f/-n, override or exported file rather than in every process
    build_eval_exp(args, load_exported_model(args.ckpt) if exported_format(args.ckpt) else None)
    # each process rebuilds the exp: an exp class loaded from a file does not pickle into spawned workers
    return launch(
        evaluate,
        args.devices,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        backend=args.dist_backend,
        dist_url=args.dist_url,
        args=(args,),
    )


if __name__ == "__main__":
    run_tool(main)
