"""The export formats, one row each in FORMATS (its file suffix, writer, runner and optional dependency), and
everything that goes by a file's format: which format a file is, writing one, opening one, its size on disk
and the metadata an export writes into it.

Adding a format: one module in this package with its `write` and `load` (see torchscript.py, the shortest),
and its row here; tools/export.py's --format, eval's and the demo's -c FILE then take it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.export import onnx, openvino, tensorrt, torchscript
from yolox_fast.export.common import (
    CalibrationImages,
    ExportedModel,
    ExportMetadata,
    describe_nms,
    is_checkpoint,
)
from yolox_fast.export.graph_nms import GraphNMS


@dataclass(frozen=True)
class ExportFormat:
    """One export format.

    title: its name in messages; suffix: its files' (lower case), which decides the runtime that opens a
    -c file; write(model, path, metadata, batch_size, calibration, opset): writes metadata.format and
    metadata.precision (`batch_size` the traced batch, `calibration` the images INT8 needs, `opset` the
    ONNX opset); load(path, device) -> ExportedModel; extra: the pip extra (setup.py's extras_require)
    that installs what writes and runs it, None when torch does; graph_nms: whether its graph can end in
    NMS (graph_nms); beside: the suffix of a file next to it that is part of the model (OpenVINO's weights),
    counted in its size.
    """

    title: str
    suffix: str
    write: Callable[..., None]
    load: Callable[[str, torch.device], ExportedModel]
    extra: str | None
    graph_nms: bool = False
    beside: str | None = None


# --format's choices in this order
FORMATS = {
    "onnx": ExportFormat(
        title="ONNX", suffix=".onnx", write=onnx.write, load=onnx.load, extra="onnx", graph_nms=True
    ),
    "torchscript": ExportFormat(
        title="TorchScript", suffix=".torchscript", write=torchscript.write, load=torchscript.load, extra=None
    ),
    "openvino": ExportFormat(
        title="OpenVINO",
        suffix=".xml",
        write=openvino.write,
        load=openvino.load,
        extra="openvino",
        graph_nms=True,
        beside=openvino.WEIGHTS_SUFFIX,
    ),
    "tensorrt": ExportFormat(
        title="TensorRT", suffix=".engine", write=tensorrt.write, load=tensorrt.load, extra="tensorrt"
    ),
}


def graph_nms_formats() -> str:
    """The formats whose graph can end in NMS, for messages: "ONNX and OpenVINO"."""
    return " and ".join(f.title for f in FORMATS.values() if f.graph_nms)


def exported_format(path: str | None) -> str | None:
    """The format (a key of FORMATS) when `path` has an exported file's suffix; None: a checkpoint."""
    suffix = Path(path).suffix.lower() if path else None
    return next((name for name, f in FORMATS.items() if f.suffix == suffix), None)


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
    if nms is not None and not FORMATS[fmt].graph_nms:
        raise ValueError(f"NMS in the graph is for {graph_nms_formats()}, not {fmt}")
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


def export_file(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    batch_size: int = 1,
    calibration: CalibrationImages | None = None,
    opset: int = 11,
) -> None:
    """Write `model` in metadata.format and metadata.precision with that format's writer: `batch_size` is
    the traced batch (the only one a static graph takes), `calibration` the images an INT8 export needs,
    `opset` the ONNX opset (INT8 raises it to 13)."""
    if metadata.precision == "int8" and calibration is None:
        raise ValueError("an INT8 export needs calibration images")
    FORMATS[metadata.format].write(model, path, metadata, batch_size, calibration, opset)


def exported_size(path: str) -> int:
    """Bytes on disk of an exported model, with the file beside it that its format counts in (an OpenVINO
    .xml's weights .bin)."""
    fmt = exported_format(path)
    beside = FORMATS[fmt].beside if fmt else None
    companion = os.path.splitext(path)[0] + beside if beside else None
    extra = os.path.getsize(companion) if companion and os.path.isfile(companion) else 0
    return os.path.getsize(path) + extra


def load_exported_model(path: str, device: torch.device | str = "cpu") -> ExportedModel:
    """Open an exported file (format by suffix, see `exported_format`) as an ExportedModel, with its format's
    runner.

    ONNX runs in onnxruntime and OpenVINO IR in OpenVINO, both on the CPU whatever `device` is; TorchScript
    runs on `device`; a TensorRT engine on `device`, a GPU. A missing
    file, a file that is not of its suffix's format, or one without yolox_fast metadata is a one-line
    FileNotFoundError / ValueError; a missing runtime a MissingExtraError.
    """
    fmt = exported_format(path)
    if fmt is None:
        suffixes = ", ".join(f.suffix for f in FORMATS.values())
        raise ValueError(f"{path}: not an exported model (suffixes: {suffixes})")
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such model file: {path}")
    if is_checkpoint(path):
        raise ValueError(
            f"{path} is a PyTorch checkpoint, not an exported model: give it a .pth name with -f/-n, or "
            "export it with tools/export.py"
        )
    model = FORMATS[fmt].load(path, torch.device(device))
    meta = model.metadata
    logger.info(
        f"loaded {fmt} model {path}: input {meta.test_size}, batch {meta.batch_size or 'any'}, "
        f"{meta.precision} (runs in {model.runs_in}), {meta.num_classes} classes, boxes decoded "
        f"{'in the graph' if meta.decode_in_graph else 'in torch'}"
        + (f", NMS in the graph ({describe_nms(meta.nms)})" if meta.nms else "")
    )
    return model
