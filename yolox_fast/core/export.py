"""ONNX export of a YOLOX model and a numerical check of the exported graph against PyTorch."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn as nn
from loguru import logger


def export_onnx(
    model: nn.Module,
    path: str,
    input_size: Sequence[int],
    batch_size: int = 1,
    dynamic: bool = False,
    opset: int = 11,
    decode_in_inference: bool = True,
) -> None:
    """Write `model` as ONNX: input "images" (B, 3, H, W) float32 BGR 0-255, output "output" (B, A, 5 + C).

    decode_in_inference=False exports the raw head outputs (box offsets not decoded to pixels, obj and
    class already sigmoid-ed), leaving the decoding to the runtime as YOLOX's ONNX demos expect.
    `dynamic` makes the batch dimension symbolic; H and W stay fixed.
    """
    model.eval()
    model.head.decode_in_inference = decode_in_inference
    dummy = torch.zeros(batch_size, 3, *input_size)
    axes = {"images": {0: "batch"}, "output": {0: "batch"}} if dynamic else None
    with warnings.catch_warnings():
        # the TorchScript-based exporter is deprecated in favour of dynamo (needs onnxscript); it is
        # still the one that handles opset 11 and dynamic_axes without extra dependencies
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (dummy,),
            path,
            input_names=["images"],
            output_names=["output"],
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )
    logger.info(
        f"exported {path}: input (B={'dynamic' if dynamic else batch_size}, 3, {input_size[0]}, "
        f"{input_size[1]}), "
        f"opset {opset}, decode_in_inference {decode_in_inference}"
    )


def compare_with_onnxruntime(model: nn.Module, path: str, images: torch.Tensor) -> float | None:
    """Max |ONNX - PyTorch| over the outputs for `images` (B, 3, H, W); None if onnxruntime is missing."""
    try:
        import onnxruntime as ort
    except ImportError:
        logger.warning("onnxruntime is not installed (pip install onnxruntime): output check skipped")
        return None
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (onnx_out,) = session.run(["output"], {"images": images.numpy()})
    with torch.no_grad():
        torch_out = model.eval().cpu()(images).numpy()
    if onnx_out.shape != torch_out.shape:
        raise RuntimeError(f"ONNX output shape {onnx_out.shape} differs from PyTorch {torch_out.shape}")
    return float(np.abs(onnx_out - torch_out).max())
