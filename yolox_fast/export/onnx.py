"""ONNX (`.onnx`): written by torch's ONNX exporter, INT8 by onnxruntime's static quantization (QDQ), run in
onnxruntime on the CPU. The metadata is the model's metadata_props entry "yolox_fast" (JSON). OpenVINO and
TensorRT are converted from this format's export.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings

import numpy as np
import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.export.common import (
    METADATA_KEY,
    CalibrationImages,
    ExportedModel,
    ExportMetadata,
    decoding,
    no_metadata,
    with_graph_nms,
)
from yolox_fast.export.graph_nms import OUTPUT_NAMES
from yolox_fast.utils.extras import require

# per-channel weight scales (DequantizeLinear's axis) need opset 13
INT8_MIN_OPSET = 13


def export_onnx(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    batch_size: int = 1,
    opset: int = 11,
) -> None:
    """Write `model` (fp32, CPU) as ONNX with `metadata` as the metadata_props entry "yolox_fast" (JSON).

    metadata.batch_size None makes the batch dimension symbolic; H and W are metadata.test_size, fixed.
    metadata.decode_in_graph False exports the raw head outputs, as YOLOX's ONNX demos expect;
    metadata.nms ends the graph in `DetectWithNMS`'s outputs.
    """
    onnx = require("onnx", "onnx")
    dynamic = metadata.batch_size is None
    dummy = torch.zeros(batch_size, 3, *metadata.test_size)
    graph, output_names = model.eval(), ["output"]
    if metadata.nms is not None:
        graph, output_names = with_graph_nms(model, metadata), list(OUTPUT_NAMES)
    axes = {name: {0: "batch"} for name in ["images", *output_names]} if dynamic else None
    with decoding(model, metadata.decode_in_graph), warnings.catch_warnings():
        # the TorchScript-based exporter is deprecated in favour of dynamo (needs onnxscript); it is
        # still the one that handles opset 11 and dynamic_axes without extra dependencies
        warnings.simplefilter("ignore", DeprecationWarning)
        # the NMS op's torch forward runs once while tracing; its graph is the ONNX op, not that trace
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            graph,
            (dummy,),
            path,
            input_names=["images"],
            output_names=output_names,
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )
    _set_metadata(onnx, path, metadata)
    logger.info(
        f"exported {path}: input (B={'dynamic' if dynamic else batch_size}, 3, {metadata.test_size[0]}, "
        f"{metadata.test_size[1]}), opset {opset}, decode_in_inference {metadata.decode_in_graph}, "
        f"NMS in the graph {metadata.nms is not None}"
    )


def quantize_onnx(source: str, path: str, metadata: ExportMetadata, calibration: CalibrationImages) -> None:
    """Write `source` (an fp32 ONNX export, opset >= 13) as INT8 in onnxruntime's QDQ form, the metadata entry
    replaced by `metadata` (precision "int8").

    The convolutions are quantized (weights int8 per output channel, inputs uint8 per tensor, ranges the
    99.999th percentile over `calibration`), except the depthwise ones and the head's last 1x1 convolutions
    (boxes, objectness, classes), which stay fp32. Measured on the shapes nano (`tools/benchmark.py deploy`):
    quantizing every op instead lost 29 AP50:95 points (the head's output concatenates pixel offsets and
    probabilities, one uint8 range for both), this recipe 6.7; min/max ranges instead of the percentile
    cost 3.4 more, quantizing the depthwise convolutions 3.9 more.
    """
    onnx = require("onnx", "onnx")
    require("onnxruntime", "onnx")
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration)

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {"images": batch}

    def depthwise(node) -> bool:
        return any(a.name == "group" and a.i > 1 for a in node.attribute)

    convs = [node for node in onnx.load(source).graph.node if node.op_type == "Conv"]
    kept_fp32 = [node.name for node in convs if depthwise(node) or "_preds" in node.name]

    def quantize(method) -> None:
        quantize_static(
            source,
            path,
            Reader(),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["Conv"],
            nodes_to_exclude=kept_fp32,
            per_channel=True,
            weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8,
            calibrate_method=method,
        )

    try:
        quantize(CalibrationMethod.Percentile)
    except ValueError as err:
        if "bins" not in str(err):
            raise
        # the percentile's histogram needs a spread: an activation constant over every calibration image
        # (a dead channel, an untrained model) has none
        logger.warning(f"percentile ranges impossible ({err}): min/max ranges instead (less accurate)")
        quantize(CalibrationMethod.MinMax)
    _set_metadata(onnx, path, metadata)


def _set_metadata(onnx, path: str, metadata: ExportMetadata) -> None:
    graph = onnx.load(path)
    kept = [entry for entry in graph.metadata_props if entry.key != METADATA_KEY]
    del graph.metadata_props[:]
    graph.metadata_props.extend(kept)
    entry = graph.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, metadata.to_json()
    onnx.save(graph, path)


def export_onnx_int8(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    calibration: CalibrationImages,
    batch_size: int = 1,
    opset: int = INT8_MIN_OPSET,
) -> None:
    """An fp32 ONNX export of `model` at opset >= 13, then `quantize_onnx` into `path`."""
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "fp32.onnx")
        fp32 = dataclasses.replace(metadata, precision="fp32")
        export_onnx(model, source, fp32, batch_size, max(opset, INT8_MIN_OPSET))
        quantize_onnx(source, path, metadata, calibration)
    logger.info(f"quantized {path} to INT8 on {calibration.num_images} training images")


def write(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    batch_size: int,
    calibration: CalibrationImages | None,
    opset: int,
) -> None:
    """The format table's writer: `export_onnx`, or `export_onnx_int8` for precision "int8"."""
    if metadata.precision == "int8":
        export_onnx_int8(model, path, metadata, calibration, batch_size, opset)
    else:
        export_onnx(model, path, metadata, batch_size, opset)


def load(path: str, device: torch.device) -> ExportedModel:
    """The format table's runner: the file in an onnxruntime session on the CPU, whatever `device` is."""
    ort = require("onnxruntime", "onnx")
    options = ort.SessionOptions()
    # as many threads as torch uses here: under eval -d N each process gets its share of the cores
    options.intra_op_num_threads = torch.get_num_threads()
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 -- onnxruntime's InvalidProtobuf, Fail... derive from Exception
        raise ValueError(
            f"{path} is not an ONNX model onnxruntime can load: {str(err).strip()[:200]}"
        ) from None
    text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if text is None:
        raise no_metadata(path)
    meta = ExportMetadata.from_json(text, path)
    input_name = session.get_inputs()[0].name

    def run(images: torch.Tensor) -> list[torch.Tensor]:
        outs = session.run(None, {input_name: np.ascontiguousarray(images.cpu().numpy(), dtype=np.float32)})
        return [torch.from_numpy(out) for out in outs]

    return ExportedModel(path, meta, run, torch.device("cpu"))
