"""TorchScript (`.torchscript`): a traced copy of the model (fp32, or fp16 traced on CUDA), run by torch on
the device it is loaded to. The metadata is the archive's extra file yolox_fast.json.
"""

from __future__ import annotations

import copy
import warnings

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

EXTRA_FILE = f"{METADATA_KEY}.json"


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
            torch.jit.save(traced, path, _extra_files={EXTRA_FILE: metadata.to_json()})
    logger.info(
        f"exported {path}: input (B=any, 3, {metadata.test_size[0]}, {metadata.test_size[1]}), "
        f"{metadata.precision} on {device.type}, decode_in_inference {metadata.decode_in_graph}"
    )


def write(
    model: nn.Module,
    path: str,
    metadata: ExportMetadata,
    batch_size: int,
    calibration: CalibrationImages | None,
    opset: int,
) -> None:
    """The format table's writer: `export_torchscript` on metadata.device (the trace takes any batch; no
    INT8, no opset)."""
    export_torchscript(model, path, metadata, metadata.device)


def load(path: str, device: torch.device) -> ExportedModel:
    """The format table's runner: the archive loaded onto `device` (an fp16 one needs CUDA)."""
    extra = {EXTRA_FILE: ""}
    try:
        # map_location (not a later .to) also moves the graph's constants, the head's grids among them
        with warnings.catch_warnings():
            # torch.jit is deprecated in favour of torch.export, but is what runs a .torchscript file
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(path, map_location=device, _extra_files=extra)
    except (RuntimeError, ValueError) as err:
        reason = str(err).strip().splitlines()[0][:200]
        raise ValueError(f"{path} is not a TorchScript file torch.jit.load can read: {reason}") from None
    if not extra[EXTRA_FILE]:
        raise no_metadata(path)
    meta = ExportMetadata.from_json(extra[EXTRA_FILE], path)
    if meta.precision == "fp16" and device.type != "cuda":
        raise ValueError(
            f"{path} is an fp16 TorchScript for CUDA; run it on a GPU (--device gpu) or export fp32"
        )
    module.eval()
    dtype = torch.float16 if meta.precision == "fp16" else torch.float32

    def run(images: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            return [module(images.to(device, dtype))]

    return ExportedModel(path, meta, run, device)
