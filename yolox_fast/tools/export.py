"""Export a checkpoint to ONNX, TorchScript or OpenVINO with its metadata, then check it against PyTorch.

python tools/export.py --format onnx -f exps/example/shapes_nano.py      # best_ckpt.pth -> shapes_nano.onnx
python tools/export.py --format onnx -n yolox-s -c yolox_s.pth --dynamic --decode-in-inference
python tools/export.py --format onnx -f exps/example/shapes_nano.py --dynamic --int8   # calibrated INT8
python tools/export.py --format onnx -f exps/example/shapes_nano.py --nms --nms-conf 0.3  # ends in NMS
python tools/export.py --format openvino -f exps/example/shapes_nano.py --dynamic   # shapes_nano.xml + .bin
python tools/export.py --format openvino -f exps/example/shapes_nano.py --dynamic --int8 --calib-images 300
python tools/export.py --format torchscript -f exps/yolox_nano.py -c best_ckpt.pth
python tools/export.py --format torchscript -n yolox-s -c yolox_s.pth --device gpu --half  # fp16, CUDA
python tools/export.py --format tensorrt -n yolox-s -c yolox_s.pth --dynamic --batch-size 32 --half  # GPU

The file carries class names, input size, strides, num_classes, whether it decodes, its precision and the
exp's test_conf / nmsthre, so `tools/eval.py -c FILE` and `tools/demo.py image -c FILE` need no -f.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from loguru import logger

from yolox_fast.core.cli import (
    add_exp_arguments,
    add_random_weights_argument,
    build_exp,
    default_checkpoint,
    parse_with_overrides,
    run_tool,
)
from yolox_fast.data.build import build_calibration_dataset
from yolox_fast.export import (
    FORMATS,
    CalibrationImages,
    GraphNMS,
    export_file,
    export_metadata,
    exported_size,
    load_exported_model,
    output_diff,
)
from yolox_fast.export.formats import graph_nms_formats
from yolox_fast.inference import load_inference_model


def add_nms_arguments(p: argparse.ArgumentParser) -> None:
    """The flags for NMS in the graph (`graph_nms`)."""
    p.add_argument(
        "--nms",
        action="store_true",
        help="ONNX / OpenVINO: end the graph in score filter + NMS; outputs detections (B, D, 6) "
        "[x1, y1, x2, y2, score, class] in input px and num_detections (B,) (docs/deployment.md)",
    )
    p.add_argument(
        "--nms-conf", type=float, default=None, help="--nms: keep score > this (default test_conf)"
    )
    p.add_argument("--nms-iou", type=float, default=None, help="--nms: NMS IoU threshold (default nmsthre)")
    p.add_argument("--nms-agnostic", action="store_true", help="--nms: NMS across classes, not within each")
    p.add_argument("--max-det", type=int, default=100, help="--nms: detections per image, D (default 100)")


def graph_nms_from_args(args: argparse.Namespace, exp) -> GraphNMS | None:
    """The GraphNMS --nms asks for (thresholds default to the exp's evaluation ones), None without it."""
    if not args.nms:
        return None
    conf = exp.test_conf if args.nms_conf is None else args.nms_conf
    iou = exp.nmsthre if args.nms_iou is None else args.nms_iou
    return GraphNMS(conf, iou, args.nms_agnostic, args.max_det)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("yolox_fast export")
    p.add_argument("--format", choices=tuple(FORMATS), default="onnx", help="file format (default onnx)")
    p.add_argument(
        "--output-name",
        type=str,
        default=None,
        help="output path (default: <exp_name>[_fp16|_int8].onnx / .torchscript / .xml)",
    )
    p.add_argument("-o", "--opset", type=int, default=11, help="ONNX opset version")
    p.add_argument(
        "--batch-size", type=int, default=1, help="batch size of a static ONNX graph (TorchScript takes any)"
    )
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="ONNX / OpenVINO: symbolic batch; TensorRT: batches 1 to --batch-size",
    )
    p.add_argument(
        "--decode-in-inference",
        action="store_true",
        help="decode boxes to pixels inside the graph (default: raw head outputs, decoded by the caller)",
    )
    add_nms_arguments(p)
    p.add_argument(
        "--half",
        action="store_true",
        help="fp16: OpenVINO weights in fp16; TorchScript traced in fp16 (CUDA only: needs --device gpu)",
    )
    p.add_argument(
        "--int8",
        action="store_true",
        help="ONNX / OpenVINO quantized to INT8, calibrated on training images (see --calib-images)",
    )
    p.add_argument(
        "--calib-images",
        type=int,
        default=300,
        help="training images the INT8 calibration measures activation ranges on (default 300)",
    )
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="TorchScript: device to trace on")
    add_exp_arguments(
        p,
        "checkpoint (ours, which stores its exp: then -f/-n is optional, or official YOLOX's); default: "
        "<output_dir>/<exp_name>/best_ckpt.pth if it exists",
    )
    p.add_argument("--tsize", type=int, default=None, help="square input size (default: exp.test_size)")
    add_random_weights_argument(p)
    p.add_argument("--no-check", action="store_true", help="skip the comparison with PyTorch")
    return p


def check_flags(args) -> None:
    """Flags that do not fit the format: one clear error rather than a file that ignores them."""
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.format == "onnx" and args.half:
        raise ValueError(
            "--half: onnxruntime's CPU provider has no fp16 convolutions; for smaller, faster CPU files use "
            "--int8, or --format openvino --half"
        )
    if args.format in ("onnx", "openvino") and args.device == "gpu":
        raise ValueError(
            f"--device gpu is for TorchScript and TensorRT; {args.format} is exported on the CPU"
        )
    if args.format == "tensorrt" and args.int8:
        raise ValueError(
            "--int8 for TensorRT is not built (it needs a calibrator run on the GPU): use --half"
        )
    if args.format == "torchscript" and (args.dynamic or args.int8):
        raise ValueError("--dynamic and --int8 are for ONNX and OpenVINO (TorchScript takes any batch)")
    if args.nms and (not FORMATS[args.format].graph_nms or args.int8):
        raise ValueError(
            f"--nms: NMS in the graph is for {graph_nms_formats()}, and not built for INT8 files"
        )
    if args.int8 and args.half:
        raise ValueError("--int8 and --half: choose one precision")
    if args.int8 and args.calib_images < 1:
        raise ValueError(f"--calib-images must be >= 1, got {args.calib_images}")
    if args.format == "tensorrt" and not torch.cuda.is_available():
        raise ValueError("--format tensorrt builds the engine on the NVIDIA GPU it runs on: no CUDA here")
    if args.device == "gpu" and not torch.cuda.is_available():
        raise ValueError("--device gpu but CUDA is not available here")
    if args.format == "torchscript" and args.half and args.device != "gpu":
        raise ValueError(
            "--half: fp16 TorchScript runs on CUDA only (CPU convolutions have no fp16 kernels); "
            "add --device gpu on a CUDA machine, or export fp32"
        )


def main(argv=None, parser: argparse.ArgumentParser | None = None, exp=None) -> str:
    """Export as the command line `argv` says (`parser`: another tool's flags over this one's; `exp`: an exp
    object in place of -f/-n, the Python API's); returns the written file's path."""
    args = parse_with_overrides(parser or make_parser(), argv)
    check_flags(args)
    exp = build_exp(args, exp=exp)
    ckpt = default_checkpoint(exp, args.ckpt)
    precision = "int8" if args.int8 else "fp16" if args.half else "fp32"
    tag = ("" if precision == "fp32" else f"_{precision}") + ("_nms" if args.nms else "")
    output = args.output_name or f"{exp.exp_name}{tag}{FORMATS[args.format].suffix}"
    device = "cuda" if args.device == "gpu" or args.format == "tensorrt" else "cpu"

    model, class_names = load_inference_model(exp, ckpt, "cpu", random_weights=args.random_weights)
    static_batch = None if args.dynamic or args.format == "torchscript" else args.batch_size
    calibration = None
    if args.int8:
        exp.prepare_dataset()
        calibration = CalibrationImages(build_calibration_dataset(exp), args.calib_images, static_batch or 1)
        logger.info(f"INT8 calibration on {calibration.num_images} training images at {exp.test_size}")
    nms = graph_nms_from_args(args, exp)
    meta = export_metadata(
        exp,
        model,
        class_names,
        args.format,
        args.decode_in_inference,
        static_batch,
        precision,
        device,
        calibration.num_images if calibration else 0,
        nms,
    )
    if args.format == "tensorrt" and args.dynamic:
        meta = dataclasses.replace(meta, max_batch=args.batch_size)
    export_file(model, output, meta, args.batch_size, calibration, args.opset)
    print(f"exported {output} ({exported_size(output) / 2**20:.1f} MiB)")
    if args.no_check:
        return output
    # one more image than the traced batch: a dynamic graph at another batch, a static one padded
    batch = args.batch_size + 1
    images = torch.rand(batch, 3, *exp.test_size, generator=torch.Generator().manual_seed(0)) * 255
    diff, relative = output_diff(model, load_exported_model(output, device), images)
    logger.info(f"{args.format} {precision} vs PyTorch on a batch of {batch} noise images, decoded outputs:")
    print(f"max abs diff: {diff:.3e} (relative: {relative:.3e})")
    if precision != "fp32":
        print(f"{precision} differs from fp32 by design: `python tools/eval.py -c {output}` scores its AP")
    return output


if __name__ == "__main__":
    run_tool(main)
