"""Export a YOLOX model to a deployable file (ONNX, TorchScript, OpenVINO IR; fp32, fp16 where the runtime
has it, INT8 calibrated on training images) that carries its metadata, and check the file, read back as eval
and the demo read it, against PyTorch.

Input "images" (B, 3, H, W) float32 BGR 0-255 letterboxed; output "output" (B, A, 5 + C): boxes decoded to
pixels in the graph, or raw offsets (obj and classes through sigmoid either way) left to the runtime; or,
with NMS in the graph (ONNX and OpenVINO), "detections" (B, D, 6) and "num_detections" (B,) (see graph_nms).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import math
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.inference.exported import (
    METADATA_KEY,
    TENSORRT_SIDECAR,
    TORCHSCRIPT_EXTRA,
    ExportedModel,
    ExportMetadata,
    require,
)
from yolox_fast.inference.graph_nms import OUTPUT_NAMES, DetectWithNMS, GraphNMS

FORMATS = ("onnx", "torchscript", "openvino", "tensorrt")
SUFFIXES = {"onnx": ".onnx", "torchscript": ".torchscript", "openvino": ".xml", "tensorrt": ".engine"}
# per-channel weight scales (DequantizeLinear's axis) need opset 13
INT8_MIN_OPSET = 13


def add_nms_arguments(p: argparse.ArgumentParser) -> None:
    """tools/export.py's flags for NMS in the graph (`graph_nms`)."""
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


def check_nms_flags(args: argparse.Namespace) -> None:
    """--nms with a format or precision it is not built for: one clear error before anything is loaded."""
    if args.nms and (args.format not in ("onnx", "openvino") or args.int8):
        raise ValueError("--nms: NMS in the graph is for ONNX and OpenVINO, and not built for INT8 files")


def graph_nms_from_args(args: argparse.Namespace, exp) -> GraphNMS | None:
    """The GraphNMS --nms asks for (thresholds default to the exp's evaluation ones), None without it."""
    if not args.nms:
        return None
    conf = exp.test_conf if args.nms_conf is None else args.nms_conf
    iou = exp.nmsthre if args.nms_iou is None else args.nms_iou
    return GraphNMS(conf, iou, args.nms_agnostic, args.max_det)


def export_metadata(
    exp,
    model: nn.Module,
    class_names: Sequence[str],
    fmt: str,
    decode_in_graph: bool,
    batch_size: int | None,
    precision: str = "fp32",
    device: str = "cpu",
    calibration_images: int = 0,
    nms: GraphNMS | None = None,
) -> ExportMetadata:
    """The metadata a file exported from `exp`'s `model` carries (see ExportMetadata); `nms` puts the
    score filter and NMS in the graph (ONNX and OpenVINO), which decodes the boxes then."""
    if nms is not None and fmt not in ("onnx", "openvino"):
        raise ValueError(f"NMS in the graph is for ONNX and OpenVINO, not {fmt}")
    if nms is not None and precision == "int8":
        raise ValueError("NMS in the graph is not built for INT8 files: export fp32 (or OpenVINO fp16)")
    return ExportMetadata(
        format=fmt,
        class_names=tuple(str(n) for n in class_names),
        num_classes=int(exp.num_classes),
        test_size=(int(exp.test_size[0]), int(exp.test_size[1])),
        strides=tuple(int(s) for s in model.head.strides),
        decode_in_graph=decode_in_graph or nms is not None,
        batch_size=batch_size,
        precision=precision,
        device=device,
        test_conf=float(exp.test_conf),
        nmsthre=float(exp.nmsthre),
        exp_name=str(exp.exp_name),
        dataset=str(exp.dataset),
        data_dir=exp.data_dir,
        calibration_images=calibration_images,
        nms=nms,
    )


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
        graph, output_names = _with_nms(model, metadata), list(OUTPUT_NAMES)
    axes = {name: {0: "batch"} for name in ["images", *output_names]} if dynamic else None
    with _decoding(model, metadata.decode_in_graph), warnings.catch_warnings():
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
    _set_onnx_metadata(onnx, path, metadata)
    logger.info(
        f"exported {path}: input (B={'dynamic' if dynamic else batch_size}, 3, {metadata.test_size[0]}, "
        f"{metadata.test_size[1]}), opset {opset}, decode_in_inference {metadata.decode_in_graph}, "
        f"NMS in the graph {metadata.nms is not None}"
    )


def _with_nms(model: nn.Module, metadata: ExportMetadata) -> DetectWithNMS:
    """`model` followed by metadata.nms, for an input of metadata.test_size."""
    with torch.no_grad(), _decoding(model, True):
        anchors = model.eval()(torch.zeros(1, 3, *metadata.test_size)).shape[1]
    return DetectWithNMS(model, anchors, metadata.nms).eval()


def export_torchscript(
    model: nn.Module, path: str, metadata: ExportMetadata, device: torch.device | str = "cpu"
) -> None:
    """Trace a copy of `model` on `device` (fp16 when metadata.precision says so) and save it with `metadata`
    as the archive's extra file yolox_fast.json. The traced graph takes any batch size (nothing in YOLOX's
    forward depends on it); H and W are fixed at metadata.test_size.
    """
    device = torch.device(device)
    dtype = torch.float16 if metadata.precision == "fp16" else torch.float32
    if dtype == torch.float16 and device.type != "cuda":
        raise ValueError(
            "fp16 TorchScript runs on CUDA only (CPU convolutions have no fp16 kernels): "
            "export on a GPU (--device gpu) or drop --half"
        )
    traced_model = copy.deepcopy(model).eval().to(device, dtype)
    traced_model.head.decode_in_inference = metadata.decode_in_graph
    dummy = torch.zeros(1, 3, *metadata.test_size, device=device, dtype=dtype)
    with torch.no_grad():
        # one forward first fills the head's grid cache, so the trace holds the grids as constants
        # (which torch.jit.load's map_location moves) rather than arange ops pinned to this device
        traced_model(dummy)
        with warnings.catch_warnings():
            # tracing warns that H and W become constants: they are fixed at export by design; torch.jit is
            # deprecated in favour of torch.export, but TorchScript is the format asked for
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", FutureWarning)
            traced = torch.jit.trace(traced_model, dummy)
            torch.jit.save(traced, path, _extra_files={TORCHSCRIPT_EXTRA: metadata.to_json()})
    logger.info(
        f"exported {path}: input (B=any, 3, {metadata.test_size[0]}, {metadata.test_size[1]}), "
        f"{metadata.precision} on {device.type}, decode_in_inference {metadata.decode_in_graph}"
    )


class CalibrationImages:
    """Training images letterboxed as evaluation letterboxes them (no augmentation), in batches of
    `batch_size` float32 (b, 3, H, W) arrays: what an INT8 export measures its activation ranges on.

    `dataset` yields eval items (see DetectionDataset.__getitem__); `num_images` are drawn evenly over it
    (seeded), at least one full batch. Iterable more than once (NNCF passes over it twice).
    """

    def __init__(self, dataset, num_images: int, batch_size: int, seed: int = 0) -> None:
        if len(dataset) < batch_size:
            raise ValueError(
                f"INT8 calibration needs at least {batch_size} training images (the graph's batch), "
                f"the training split has {len(dataset)}"
            )
        count = min(num_images, len(dataset)) // batch_size * batch_size
        picked = np.random.default_rng(seed).choice(len(dataset), count, replace=False)
        self.dataset = dataset
        self.batches = [np.sort(picked[i : i + batch_size]) for i in range(0, count, batch_size)]
        self.num_images = count

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[np.ndarray]:
        for indices in self.batches:
            yield np.stack([self.dataset[int(i)][0] for i in indices]).astype(np.float32)


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
    _set_onnx_metadata(onnx, path, metadata)


def _set_onnx_metadata(onnx, path: str, metadata: ExportMetadata) -> None:
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


def export_tensorrt(
    model: nn.Module, path: str, metadata: ExportMetadata, batch_size: int = 1, workspace_gib: int = 4
) -> None:
    """UNTESTED here (no GPU on the development machine; tools/gpu_check.sh runs it). Build a TensorRT engine
    (`path`, a plain serialized plan) from an ONNX export of `model`, fp16 kernels allowed when
    metadata.precision is "fp16", and write `metadata` beside it as `<path>.json`.

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
    with open(path + TENSORRT_SIDECAR, "w") as out:
        out.write(metadata.to_json())
    sidecar = os.path.basename(path) + TENSORRT_SIDECAR
    logger.info(f"built {path} (+ {sidecar}): batch {low}-{high}, {metadata.precision}")


def export_file(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    batch_size: int = 1,
    calibration: CalibrationImages | None = None,
    opset: int = 11,
) -> None:
    """Write `model` in metadata.format and metadata.precision (see the export_* functions): `batch_size` is
    the traced batch (the only one a static graph takes), `calibration` the images an INT8 export needs,
    `opset` the ONNX opset (INT8 raises it to 13)."""
    if metadata.precision == "int8" and calibration is None:
        raise ValueError("an INT8 export needs calibration images")
    if metadata.format == "onnx" and metadata.precision == "int8":
        export_onnx_int8(model, path, metadata, calibration, batch_size, opset)
    elif metadata.format == "onnx":
        export_onnx(model, path, metadata, batch_size, opset)
    elif metadata.format == "openvino":
        export_openvino(model, path, metadata, batch_size, calibration)
    elif metadata.format == "tensorrt":
        export_tensorrt(model, path, metadata, batch_size)
    else:
        export_torchscript(model, path, metadata, metadata.device)


def exported_size(path: str) -> int:
    """Bytes on disk of an exported model: an OpenVINO .xml with the .bin of its weights."""
    weights = os.path.splitext(path)[0] + ".bin"
    extra = os.path.getsize(weights) if path.endswith(".xml") and os.path.isfile(weights) else 0
    return os.path.getsize(path) + extra


@contextlib.contextmanager
def _decoding(model: nn.Module, decode: bool) -> Iterator[None]:
    """The head's decode_in_inference set to `decode` inside, restored on the way out."""
    saved = model.head.decode_in_inference
    model.head.decode_in_inference = decode
    try:
        yield
    finally:
        model.head.decode_in_inference = saved


def output_diff(model: nn.Module, exported: ExportedModel, images: torch.Tensor) -> tuple[float, float]:
    """(max abs, max relative) |exported - PyTorch| of the decoded (B, A, 5 + C) outputs for `images`
    (B, 3, H, W), the exported file run exactly as eval and the demo run it (`ExportedModel`).

    Relative: to max(|PyTorch|, 1), for the pixel boxes of an untrained model, whose exp(wh offset) on
    noise can reach 1e10 px; equal values (infinities included) count 0.
    A file that ends in NMS: its (B, D, 6) detections against `DetectWithNMS` in torch, rows past each
    image's count zero on both sides.
    """
    with torch.no_grad(), _decoding(model, True):
        if exported.metadata.nms is None:
            reference = model.eval().cpu()(images)
        else:
            reference, _ = _with_nms(model.cpu(), exported.metadata)(images)
    if exported.metadata.nms is None:
        out = exported(images.to(exported.device)).cpu()
    else:
        out = torch.zeros_like(reference)
        for padded, dets in zip(out, exported.detect(images.to(exported.device))):
            padded[: len(dets)] = dets.cpu()
    if out.shape != reference.shape:
        raise RuntimeError(
            f"exported output shape {tuple(out.shape)} differs from PyTorch {tuple(reference.shape)}"
        )
    diff = torch.where(out == reference, torch.zeros_like(out), (out - reference).abs())
    return float(diff.max()), float((diff / reference.abs().clamp(min=1)).max())
