"""OpenVINO IR (`.xml`, its weights in the `.bin` beside it): converted from an ONNX export, fp16 weights or
INT8 by NNCF, run by OpenVINO on the CPU. The metadata is the IR's rt_info entry "yolox_fast".
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.export.common import (
    METADATA_KEY,
    CalibrationImages,
    ExportedModel,
    ExportMetadata,
    no_metadata,
)
from yolox_fast.export.onnx import INT8_MIN_OPSET, export_onnx
from yolox_fast.utils.extras import require

WEIGHTS_SUFFIX = ".bin"


def export_openvino(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    batch_size: int = 1,
    calibration: CalibrationImages | None = None,
) -> None:
    """Write `model` as an OpenVINO IR (`path` .xml, weights in the .bin beside it) with `metadata` as the
    rt_info entry "yolox_fast". Converted from an ONNX export of the same graph (batch symbolic when
    metadata.batch_size is None). precision "fp16": weights stored in fp16 (the CPU plugin computes in
    fp32, or bf16 where the CPU has it); "int8": NNCF's post-training quantization over `calibration`
    (asymmetric activations: SiLU outputs go below zero; each range the extremes over all the images).
    """
    ov = require("openvino", "openvino")
    if metadata.precision == "int8" and calibration is None:
        raise ValueError("an INT8 export needs calibration images")
    coarsest = [math.ceil(side / max(metadata.strides)) for side in metadata.test_size]
    if metadata.precision == "int8" and min(coarsest) < 3:
        raise ValueError(
            f"input {metadata.test_size} makes a {coarsest[0]}x{coarsest[1]} coarsest level: OpenVINO's INT8 "
            "CPU kernels crash on levels under 3x3 cells (OpenVINO 2026.4); export INT8 at "
            f"{2 * max(metadata.strides) + 1} px or more"
        )
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "model.onnx")
        export_onnx(model, source, dataclasses.replace(metadata, format="onnx"), batch_size, INT8_MIN_OPSET)
        ov_model = ov.convert_model(source)
    if metadata.precision == "int8":
        nncf = require("nncf", "openvino")
        from nncf.quantization.range_estimator import RangeEstimatorParametersSet

        ov_model = nncf.quantize(
            ov_model,
            nncf.Dataset(calibration),
            preset=nncf.QuantizationPreset.MIXED,
            subset_size=len(calibration),
            # ranges over all calibration images at once: NNCF's default averages each batch's extremes, and
            # at batch 1 that clips the few large activations an object's peak makes (a trained shapes nano's
            # best objectness fell from 0.80 to 0.28; with the overall extremes it reads 0.88)
            advanced_parameters=nncf.AdvancedQuantizationParameters(
                activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX
            ),
        )
    ov_model.set_rt_info(metadata.to_json(), [METADATA_KEY])
    ov.save_model(ov_model, path, compress_to_fp16=metadata.precision == "fp16")
    logger.info(
        f"exported {path} (+ .bin): input (B={batch_size if metadata.batch_size else 'dynamic'}, 3, "
        f"{metadata.test_size[0]}, {metadata.test_size[1]}), {metadata.precision}, decode_in_inference "
        f"{metadata.decode_in_graph}"
    )


def write(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    batch_size: int,
    calibration: CalibrationImages | None,
    opset: int,
) -> None:
    """The format table's writer: `export_openvino` (converted at opset 13 whatever `opset` is)."""
    export_openvino(model, path, metadata, batch_size, calibration)


def load(path: str, device: torch.device) -> ExportedModel:
    """The format table's runner: the IR compiled for OpenVINO's CPU plugin, whatever `device` is; an fp32
    file computes in fp32."""
    ov = require("openvino", "openvino")
    weights = Path(path).with_suffix(WEIGHTS_SUFFIX)
    if not weights.is_file():
        raise ValueError(f"{path}: no {weights.name} beside it (an OpenVINO IR is the .xml and its .bin)")
    core = ov.Core()
    try:
        model = core.read_model(path, str(weights))
    except RuntimeError as err:
        lines = [line for line in str(err).splitlines() if line.strip() and "Exception from" not in line]
        reason = (lines[0] if lines else str(err)).strip()[:200]
        raise ValueError(f"{path} is not an OpenVINO IR (.xml + .bin) OpenVINO can read: {reason}") from None
    if not model.has_rt_info([METADATA_KEY]):
        raise no_metadata(path)
    meta = ExportMetadata.from_json(model.get_rt_info([METADATA_KEY]).astype(str), path)
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": torch.get_num_threads()}
    if meta.precision == "fp32":
        # on CPUs with bf16 units (AMX, AVX512-BF16) the CPU plugin would otherwise compute in bf16
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    runs_in = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}.get(
        compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name(), "?"
    )
    if meta.precision == "int8":
        runs_in = f"int8 ({runs_in} where not quantized)"

    def run(images: torch.Tensor) -> list[torch.Tensor]:
        result = request.infer({0: np.ascontiguousarray(images.cpu().numpy(), dtype=np.float32)})
        return [torch.from_numpy(np.array(result[output])) for output in compiled.outputs]

    return ExportedModel(path, meta, run, torch.device("cpu"), runs_in)
