"""TensorRT (`.engine`): a plain serialized plan built from an ONNX export on the NVIDIA GPU that runs it,
fp32 or with fp16 kernels allowed. A plan has no room for user data: the metadata sits beside it in
`<engine>.json`, so the plan stays a file other tools load.

UNTESTED here (no GPU on the development machine): tools/gpu_check.sh runs it.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.export.common import CalibrationImages, ExportedModel, ExportMetadata
from yolox_fast.export.onnx import INT8_MIN_OPSET, export_onnx
from yolox_fast.utils.extras import require

SIDECAR_SUFFIX = ".json"  # appended to the engine's name: model.engine.json


def export_tensorrt(
    model: nn.Module, path: str, metadata: ExportMetadata, batch_size: int = 1, workspace_gib: int = 4
) -> None:
    """Build a TensorRT engine (`path`, a plain serialized plan) from an ONNX export of `model`, fp16 kernels
    allowed when metadata.precision is "fp16", and write `metadata` beside it as `<path>.json`.

    metadata.batch_size None builds one optimization profile for batches 1 to metadata.max_batch (tuned
    for `batch_size`); else the engine takes exactly metadata.batch_size. Input and output stay fp32.
    """
    trt = require("tensorrt", "tensorrt")
    if not torch.cuda.is_available():
        raise ValueError(
            "a TensorRT engine is built on the NVIDIA GPU it runs on: CUDA is not available here"
        )
    h, w = metadata.test_size
    low, best, high = (
        (metadata.batch_size,) * 3
        if metadata.batch_size
        else (1, batch_size, metadata.max_batch or batch_size)
    )
    log = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(log)
    network = builder.create_network(0)  # explicit batch: TensorRT 10's only mode
    parser = trt.OnnxParser(network, log)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "model.onnx")
        onnx_meta = dataclasses.replace(metadata, format="onnx", precision="fp32")
        export_onnx(model, source, onnx_meta, metadata.batch_size or 1, INT8_MIN_OPSET)
        if not parser.parse_from_file(source):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT could not parse the ONNX export: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_gib << 30)
    if metadata.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    profile.set_shape("images", (low, 3, h, w), (best, 3, h, w), (high, 3, h, w))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError("TensorRT could not build the engine (its log above says why)")
    with open(path, "wb") as out:
        out.write(bytes(plan))
    with open(path + SIDECAR_SUFFIX, "w") as out:
        out.write(metadata.to_json())
    sidecar = os.path.basename(path) + SIDECAR_SUFFIX
    logger.info(f"built {path} (+ {sidecar}): batch {low}-{high}, {metadata.precision}")


def write(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    batch_size: int,
    calibration: CalibrationImages | None,
    opset: int,
) -> None:
    """The format table's writer: `export_tensorrt` (no INT8; the ONNX it parses is opset 13)."""
    export_tensorrt(model, path, metadata, batch_size)


def load(path: str, device: torch.device) -> ExportedModel:
    """The format table's runner: the engine on `device`, an NVIDIA GPU, run on torch's current stream."""
    if device.type != "cuda":
        where = "--device gpu" if torch.cuda.is_available() else "CUDA is not available here"
        raise ValueError(f"{path} is a TensorRT engine: it runs on an NVIDIA GPU ({where})")
    trt = require("tensorrt", "tensorrt")
    sidecar = Path(path + SIDECAR_SUFFIX)
    if not sidecar.is_file():
        raise ValueError(
            f"{path} has no {sidecar.name} beside it with its yolox_fast metadata: export it again"
        )
    meta = ExportMetadata.from_json(sidecar.read_text(), str(sidecar))
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(Path(path).read_bytes())
    if engine is None:
        raise ValueError(
            f"{path}: TensorRT {trt.__version__} cannot load it (built by another TensorRT version or for "
            "another GPU?): export it again on this machine"
        )
    context = engine.create_execution_context()

    def run(images: torch.Tensor) -> list[torch.Tensor]:
        images = images.to(device, torch.float32).contiguous()
        context.set_input_shape("images", tuple(images.shape))
        out = torch.empty(tuple(context.get_tensor_shape("output")), device=device, dtype=torch.float32)
        context.set_tensor_address("images", images.data_ptr())
        context.set_tensor_address("output", out.data_ptr())
        # on torch's stream: what follows (decode, NMS) is ordered after the engine without a host sync
        if not context.execute_async_v3(torch.cuda.current_stream(device).cuda_stream):
            raise RuntimeError(f"TensorRT could not run {path} on a batch of shape {tuple(images.shape)}")
        return [out]

    return ExportedModel(path, meta, run, device)
