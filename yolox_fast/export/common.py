"""What every export format shares: the graph's input and outputs, the metadata a file carries, the
`ExportedModel` each format's runner returns, the training images INT8 calibrates on, and the checks of a
file (its metadata, that it is no checkpoint, its input size, its outputs against PyTorch).

The contract of every exported graph. Input "images" (B, 3, H, W) float32 BGR 0-255 (no mean/std),
letterboxed to the export size (H, W) as evaluation letterboxes (data.augment.letterbox: resized by
min(H / h, W / w), pasted top-left on a canvas of 114). Output "output" (B, A, 5 + C): boxes decoded to
pixels in the graph, or raw offsets left to the runtime (objectness and classes through sigmoid either
way); or, with NMS in the graph (see graph_nms), "detections" (B, D, 6) and "num_detections" (B,).

Each format writes `ExportMetadata` into its file as the same JSON (where: the format's module), and its
runner hands the graph to `ExportedModel`, a callable that takes the letterboxed batch and returns what the
torch model returns in eval mode: (B, A, 5 + C) [cx, cy, w, h (px), obj, cls...], boxes decoded in torch
with the head's own decode when the file left them raw. The evaluators and the Predictor call it as they
call the torch model, so an exported file is scored and drawn with the same data, letterbox, NMS and
scorer. A file that ends in NMS (`metadata.nms`) is run with `ExportedModel.detect` instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.export.graph_nms import DetectWithNMS, GraphNMS
from yolox_fast.models.head import YOLOXHead, level_grid

# the key of the metadata in a file (ONNX metadata_props, OpenVINO rt_info, the TorchScript extra file's stem)
METADATA_KEY = "yolox_fast"
METADATA_VERSION = 1
PRECISIONS = ("fp32", "fp16", "int8")


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


def no_metadata(path: str) -> ValueError:
    """The error for a file of a format's kind that carries no ExportMetadata."""
    return ValueError(
        f"{path} carries no yolox_fast metadata (exported by another tool?): export it with tools/export.py"
    )


def is_checkpoint(path: str) -> bool:
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


def describe_nms(nms: GraphNMS) -> str:
    across = "across classes" if nms.class_agnostic else "within each class"
    return f"score > {nms.conf:g}, IoU {nms.iou:g} {across}, at most {nms.max_det} per image"


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
                f"{self.path} ends in its own NMS ({describe_nms(nms)}): {' and '.join(ignored)} cannot "
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


@contextlib.contextmanager
def decoding(model: nn.Module, decode: bool) -> Iterator[None]:
    """The head's decode_in_inference set to `decode` inside, restored on the way out."""
    saved = model.head.decode_in_inference
    model.head.decode_in_inference = decode
    try:
        yield
    finally:
        model.head.decode_in_inference = saved


def with_graph_nms(model: nn.Module, metadata: ExportMetadata) -> DetectWithNMS:
    """`model` followed by metadata.nms, for an input of metadata.test_size."""
    with torch.no_grad(), decoding(model, True):
        anchors = model.eval()(torch.zeros(1, 3, *metadata.test_size)).shape[1]
    return DetectWithNMS(model, anchors, metadata.nms).eval()


def output_diff(model: nn.Module, exported: ExportedModel, images: torch.Tensor) -> tuple[float, float]:
    """(max abs, max relative) |exported - PyTorch| of the decoded (B, A, 5 + C) outputs for `images`
    (B, 3, H, W), the exported file run exactly as eval and the demo run it (`ExportedModel`).

    Relative: to max(|PyTorch|, 1), for the pixel boxes of an untrained model, whose exp(wh offset) on
    noise can reach 1e10 px; equal values (infinities included) count 0.
    A file that ends in NMS: its (B, D, 6) detections against `DetectWithNMS` in torch, rows past each
    image's count zero on both sides.
    """
    with torch.no_grad(), decoding(model, True):
        if exported.metadata.nms is None:
            reference = model.eval().cpu()(images)
        else:
            reference, _ = with_graph_nms(model.cpu(), exported.metadata)(images)
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
