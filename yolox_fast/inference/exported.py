"""An exported model file (ONNX, TorchScript, OpenVINO IR): the metadata it carries and running it like the
torch model.

`tools/export.py` writes the file with `ExportMetadata` inside (ONNX: a `metadata_props` entry, TorchScript:
an extra file in the archive, OpenVINO: an rt_info entry of the .xml, all the same JSON);
`load_exported_model` reads it back as an
`ExportedModel`, a callable that takes the letterboxed float batch (B, 3, H, W) and returns what the torch
model returns in eval mode: (B, A, 5 + C) [cx, cy, w, h (px), obj, cls...], boxes decoded in torch with
the head's own decode when the file left them raw. The evaluators and the Predictor call it as they call
the torch model, so an exported file is scored and drawn with the same data, letterbox, NMS and scorer.
A file that ends in NMS (`metadata.nms`, see `graph_nms`) is run with `ExportedModel.detect` instead.
"""

from __future__ import annotations

import importlib
import json
import math
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from loguru import logger

from yolox_fast.inference.graph_nms import GraphNMS
from yolox_fast.models.head import YOLOXHead, level_grid

# file suffix -> format; the suffix decides which runtime opens a -c file
EXPORTED_SUFFIXES = {
    ".onnx": "onnx",
    ".torchscript": "torchscript",
    ".xml": "openvino",
    ".engine": "tensorrt",
}
# the ONNX metadata_props key and the OpenVINO rt_info key; the TorchScript extra file is METADATA_KEY.json
METADATA_KEY = "yolox_fast"
TORCHSCRIPT_EXTRA = f"{METADATA_KEY}.json"
# a TensorRT plan has no room for user data: its metadata sits beside it, <engine>.json, and the plan stays a
# plain TensorRT file other tools load
TENSORRT_SIDECAR = ".json"
METADATA_VERSION = 1
PRECISIONS = ("fp32", "fp16", "int8")


class MissingExtraError(ImportError):
    """A runtime package is not installed; the message names the extra that installs it."""


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, or raise MissingExtraError naming `pip install "yolox_fast[extra]"`."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtraError(
            f'{module} is not installed: pip install "yolox_fast[{extra}]" ({err})'
        ) from None


@dataclass(frozen=True)
class ExportMetadata:
    """What an exported file needs to be run and scored without its exp.

    test_size (H, W) is the graph's fixed input size; batch_size None means any batch (a dynamic ONNX
    graph, or TorchScript), else the only batch the graph takes. decode_in_graph: boxes come out in
    pixels; False: raw offsets, decoded by the caller over `strides`. precision: one of PRECISIONS, "fp16"
    for a TorchScript traced in fp16 on CUDA or an OpenVINO IR with fp16 weights, "int8" for a model
    quantized on `calibration_images` training images (0 otherwise); device: where a TorchScript file was
    traced ("cpu" or "cuda"). nms: the graph ends in score filter + NMS with these settings, its outputs
    `graph_nms.OUTPUT_NAMES`; None: it ends in the (B, A, 5 + C) head output.
    test_conf / nmsthre: the exp's scoring thresholds; exp_name, dataset and data_dir: where the exp's
    outputs went and what it was evaluated on, so that eval and demo need no -f.
    """

    format: str
    class_names: tuple[str, ...]
    num_classes: int
    test_size: tuple[int, int]
    strides: tuple[int, ...]
    decode_in_graph: bool
    batch_size: int | None
    precision: str
    device: str
    test_conf: float
    nmsthre: float
    exp_name: str
    dataset: str
    data_dir: str | None
    calibration_images: int = 0
    max_batch: int | None = None
    nms: GraphNMS | None = None
    version: int = METADATA_VERSION

    def to_json(self) -> str:
        fields = asdict(self)
        if fields["nms"] is None:
            # a file without NMS in its graph stays readable by the versions from before the field
            del fields["nms"]
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str, path: str) -> ExportMetadata:
        """Parse the JSON an export wrote; another version or shape is a ValueError naming `path`."""
        try:
            raw: dict[str, Any] = json.loads(text)
            meta = cls(
                **{
                    **raw,
                    "class_names": tuple(raw["class_names"]),
                    "test_size": tuple(raw["test_size"]),
                    "strides": tuple(raw["strides"]),
                    "nms": GraphNMS(**raw["nms"]) if raw.get("nms") else None,
                }
            )
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{path}: unreadable yolox_fast metadata ({err}); export it again") from None
        if meta.version != METADATA_VERSION:
            raise ValueError(
                f"{path}: metadata version {meta.version}, this yolox_fast reads {METADATA_VERSION}"
            )
        return meta


def exported_format(path: str | None) -> str | None:
    """The format ("onnx", "torchscript", "openvino", "tensorrt") when `path` has an exported file's suffix;
    None: a checkpoint."""
    return EXPORTED_SUFFIXES.get(Path(path).suffix.lower()) if path else None


def _no_metadata(path: str) -> ValueError:
    return ValueError(
        f"{path} carries no yolox_fast metadata (exported by another tool?): export it with tools/export.py"
    )


class ExportedModel:
    """An exported file run as the torch model is run in eval mode: `model(images)` with images (B, 3, H, W)
    float32 BGR 0-255 letterboxed to `metadata.test_size` -> (B, A, 5 + C) float32 on `device`, boxes
    decoded. A static-batch graph is fed chunks of exactly its batch size, the last one zero-padded, and a
    dynamic one with a max_batch chunks of at most that, so any batch works. `eval()` is there because the
    evaluators and the Predictor call it on any model.
    """

    def __init__(
        self, path: str, metadata: ExportMetadata, run, device: torch.device, runs_in: str = ""
    ) -> None:
        self.path = path
        self.metadata = metadata
        self.device = device
        self.runs_in = runs_in or metadata.precision  # what the runtime computes in (OpenVINO may use bf16)
        # (b, 3, H, W) tensor on `device`, b = the graph's batch -> the graph's outputs, a list of tensors:
        # [(b, A, 5 + C)], or [(b, D, 6) detections, (b,) counts] for a graph that ends in NMS
        self._run = run
        h, w = metadata.test_size
        # level sizes as the backbone makes them (each stride-2 stage rounds up), for the runtime's decode
        sizes = [(math.ceil(h / s), math.ceil(w / s)) for s in metadata.strides]
        parts = [level_grid(lh, lw, s, device, torch.float32) for (lh, lw), s in zip(sizes, metadata.strides)]
        self._grids = torch.cat([g for g, _ in parts])  # (A, 2) cell (x, y)
        self._strides = torch.cat([s for _, s in parts])  # (A,)
        self._nms_checked = False

    def eval(self) -> ExportedModel:
        return self

    def _outputs(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The graph's outputs for any batch: static graphs fed chunks of their batch, the last padded."""
        expected = (3, *self.metadata.test_size)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"{self.path} takes input (B, {', '.join(map(str, expected))}), got {tuple(images.shape)}"
            )
        step = self.metadata.batch_size or self.metadata.max_batch
        if step is None or (self.metadata.batch_size is None and len(images) <= step):
            return self._run(images)
        chunks = []
        for start in range(0, len(images), step):
            chunk = images[start : start + step]
            pad = step - len(chunk) if self.metadata.batch_size else 0
            if pad:
                chunk = torch.cat([chunk, chunk.new_zeros(pad, *chunk.shape[1:])])
            chunks.append([out[: step - pad] for out in self._run(chunk)])
        return [torch.cat(parts) for parts in zip(*chunks)]

    def detect(self, images: torch.Tensor) -> list[torch.Tensor]:
        """A graph that ends in NMS: per image of `images` (B, 3, H, W), its (K, 6) float32
        [x1, y1, x2, y2, score, class] in input pixels, best score first."""
        if self.metadata.nms is None:
            raise ValueError(f"{self.path} ends before NMS: call the model and run NMS on its output")
        detections, counts = self._outputs(images)  # (B, D, 6), (B,)
        return [dets[: int(n)].float() for dets, n in zip(detections, counts)]

    def check_nms_settings(self, conf: float, iou: float, class_agnostic: bool) -> None:
        """A caller's score threshold and NMS against the graph's: a higher threshold is applied after the
        graph (the same detections as applying it before NMS); what the graph cannot give is said once."""
        nms = self.metadata.nms
        if nms is None or self._nms_checked:
            return
        self._nms_checked = True
        ignored = []
        if conf < nms.conf:
            ignored.append(f"score threshold {conf:g} (the graph keeps > {nms.conf:g})")
        if iou != nms.iou or class_agnostic != nms.class_agnostic:
            ignored.append(f"NMS IoU {iou:g} {'across' if class_agnostic else 'within each'} class(es)")
        if ignored:
            logger.warning(
                f"{self.path} ends in its own NMS ({_describe_nms(nms)}): {' and '.join(ignored)} cannot "
                "apply; export again with --nms-conf / --nms-iou / --nms-agnostic to change them"
            )

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.metadata.nms is not None:
            raise ValueError(f"{self.path} ends in NMS: its detections come from `detect`")
        out = self._outputs(images)[0].float()
        if out.shape[1] != len(self._grids):
            raise ValueError(
                f"{self.path} gives {out.shape[1]} anchors; input {self.metadata.test_size} and strides "
                f"{self.metadata.strides} in its metadata make {len(self._grids)}"
            )
        if self.metadata.decode_in_graph:
            return out
        boxes = YOLOXHead.decode_boxes(out[..., :4], self._grids, self._strides)
        return torch.cat([boxes, out[..., 4:]], dim=-1)


def _onnx_runner(path: str) -> tuple[ExportMetadata, Any]:
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
        raise _no_metadata(path)
    meta = ExportMetadata.from_json(text, path)
    input_name = session.get_inputs()[0].name

    def run(images: torch.Tensor) -> list[torch.Tensor]:
        outs = session.run(None, {input_name: np.ascontiguousarray(images.cpu().numpy(), dtype=np.float32)})
        return [torch.from_numpy(out) for out in outs]

    return meta, run


def _torchscript_runner(path: str, device: torch.device) -> tuple[ExportMetadata, Any]:
    extra = {TORCHSCRIPT_EXTRA: ""}
    try:
        # map_location (not a later .to) also moves the graph's constants, the head's grids among them
        with warnings.catch_warnings():
            # torch.jit is deprecated in favour of torch.export, but is what runs a .torchscript file
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(path, map_location=device, _extra_files=extra)
    except (RuntimeError, ValueError) as err:
        reason = str(err).strip().splitlines()[0][:200]
        raise ValueError(f"{path} is not a TorchScript file torch.jit.load can read: {reason}") from None
    if not extra[TORCHSCRIPT_EXTRA]:
        raise _no_metadata(path)
    meta = ExportMetadata.from_json(extra[TORCHSCRIPT_EXTRA], path)
    if meta.precision == "fp16" and device.type != "cuda":
        raise ValueError(
            f"{path} is an fp16 TorchScript for CUDA; run it on a GPU (--device gpu) or export fp32"
        )
    module.eval()
    dtype = torch.float16 if meta.precision == "fp16" else torch.float32

    def run(images: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            return [module(images.to(device, dtype))]

    return meta, run


def _openvino_runner(path: str) -> tuple[ExportMetadata, Any, str]:
    ov = require("openvino", "openvino")
    weights = Path(path).with_suffix(".bin")
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
        raise _no_metadata(path)
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

    return meta, run, runs_in


def _tensorrt_runner(path: str, device: torch.device) -> tuple[ExportMetadata, Any]:
    """UNTESTED here (no GPU on the development machine): tools/gpu_check.sh runs it."""
    if device.type != "cuda":
        where = "--device gpu" if torch.cuda.is_available() else "CUDA is not available here"
        raise ValueError(f"{path} is a TensorRT engine: it runs on an NVIDIA GPU ({where})")
    trt = require("tensorrt", "tensorrt")
    sidecar = Path(path + TENSORRT_SIDECAR)
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

    return meta, run


def load_exported_model(path: str, device: torch.device | str = "cpu") -> ExportedModel:
    """Open an exported file (format by suffix, see `exported_format`) as an ExportedModel.

    ONNX runs in onnxruntime and OpenVINO IR in OpenVINO, both on the CPU whatever `device` is; TorchScript
    runs on `device`; a TensorRT engine on `device`, a GPU. A missing
    file, a file that is not of its suffix's format, or one without yolox_fast metadata is a one-line
    FileNotFoundError / ValueError; a missing runtime a MissingExtraError.
    """
    fmt = exported_format(path)
    if fmt is None:
        raise ValueError(f"{path}: not an exported model (suffixes: {', '.join(EXPORTED_SUFFIXES)})")
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such model file: {path}")
    if _is_checkpoint(path):
        raise ValueError(
            f"{path} is a PyTorch checkpoint, not an exported model: give it a .pth name with -f/-n, or "
            "export it with tools/export.py"
        )
    device = torch.device(device)
    runs_in = ""
    if fmt == "onnx":
        meta, run = _onnx_runner(path)
        device = torch.device("cpu")
    elif fmt == "openvino":
        meta, run, runs_in = _openvino_runner(path)
        device = torch.device("cpu")
    elif fmt == "tensorrt":
        meta, run = _tensorrt_runner(path, device)
    else:
        meta, run = _torchscript_runner(path, device)
    model = ExportedModel(path, meta, run, device, runs_in)
    logger.info(
        f"loaded {fmt} model {path}: input {meta.test_size}, batch {meta.batch_size or 'any'}, "
        f"{meta.precision} (runs in {model.runs_in}), {meta.num_classes} classes, boxes decoded "
        f"{'in the graph' if meta.decode_in_graph else 'in torch'}"
        + (f", NMS in the graph ({_describe_nms(meta.nms)})" if meta.nms else "")
    )
    return model


def _describe_nms(nms: GraphNMS) -> str:
    across = "across classes" if nms.class_agnostic else "within each class"
    return f"score > {nms.conf:g}, IoU {nms.iou:g} {across}, at most {nms.max_det} per image"


def _is_checkpoint(path: str) -> bool:
    """A torch.save zip (data.pkl inside, and no constants.pkl, which a TorchScript archive has)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        names = {name.split("/", 1)[-1] for name in archive.namelist()}
    return "data.pkl" in names and "constants.pkl" not in names


def check_input_size(metadata: ExportMetadata, size: Sequence[int], path: str) -> None:
    """A requested test size (--tsize) must be the graph's: its input size is fixed at export."""
    if tuple(size) != tuple(metadata.test_size):
        raise ValueError(
            f"--tsize {size[0]} does not match {path}, exported for input {tuple(metadata.test_size)}: "
            "drop --tsize or export again at that size"
        )
