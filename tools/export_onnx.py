"""Export a YOLOX checkpoint to ONNX, then check the ONNX output against PyTorch with onnxruntime.

python tools/export_onnx.py -n yolox-s -c yolox_s.pth --output-name yolox_s.onnx
python tools/export_onnx.py -f exps/yolox_nano.py -c best_ckpt.pth --dynamic --decode-in-inference
"""

from __future__ import annotations

import argparse

import torch
from loguru import logger

from yolox_fast.core.cli import add_exp_arguments, build_exp, parse_with_overrides, run_tool
from yolox_fast.core.export import compare_with_onnxruntime, export_onnx
from yolox_fast.inference import load_inference_model


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("yolox_fast onnx export")
    p.add_argument("--output-name", type=str, default="yolox.onnx", help="output .onnx path")
    p.add_argument("-o", "--opset", type=int, default=11, help="ONNX opset version")
    p.add_argument("--batch-size", type=int, default=1, help="batch size of the static graph")
    p.add_argument("--dynamic", action="store_true", help="symbolic batch dimension")
    p.add_argument(
        "--decode-in-inference",
        action="store_true",
        help="decode boxes to pixels inside the graph (default: raw head outputs, decoded by the caller)",
    )
    add_exp_arguments(p, "checkpoint (ours or official YOLOX)")
    p.add_argument("--tsize", type=int, default=None, help="square input size (default: exp.test_size)")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    return p


def main(argv=None) -> None:
    args = parse_with_overrides(make_parser(), argv)
    exp = build_exp(args)

    model, _ = load_inference_model(exp, args.ckpt, "cpu")
    export_onnx(
        model,
        args.output_name,
        exp.test_size,
        args.batch_size,
        args.dynamic,
        args.opset,
        args.decode_in_inference,
    )
    if args.no_check:
        return
    # a dynamic graph is checked at another batch size than the one it was traced with
    batch = args.batch_size + 1 if args.dynamic else args.batch_size
    images = torch.rand(batch, 3, *exp.test_size, generator=torch.Generator().manual_seed(0)) * 255
    diff = compare_with_onnxruntime(model, args.output_name, images)
    if diff is not None:
        logger.info(f"onnxruntime vs PyTorch on a batch of {batch}: max abs diff {diff:.3e}")
        print(f"max abs diff: {diff:.3e}")


if __name__ == "__main__":
    run_tool(main)
