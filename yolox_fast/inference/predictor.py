"""Inference: load a model for prediction, then letterbox -> forward -> NMS -> original pixels, in batches.

The lowest layer that runs a trained model: the evaluators, the demo, the export check and the
trainer's demo image all go through `detect_batch` (one timed forward + NMS) or `Predictor`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.data.augment import letterbox
from yolox_fast.export import ExportedModel
from yolox_fast.models.network_blocks import fuse_model
from yolox_fast.utils.amp import autocast
from yolox_fast.utils.boxes import postprocess
from yolox_fast.utils.checkpoint import CheckpointError, load_checkpoint, load_model_weights
from yolox_fast.utils.compile import CompileStats, compile_for_inference
from yolox_fast.utils.metric import sync_device

NO_WEIGHTS = (
    "no weights: give -c with a checkpoint (best_ckpt.pth), an exported file or a zoo name (yolox-s), or "
    "--random-weights to run an untrained model on purpose (Python: random_weights=True)"
)

# (K, 6) float64 per image: x1, y1, x2, y2 in original image pixels, score = obj * cls_conf, class index
Detections = np.ndarray


def letterbox_ratio(img_size: Sequence[int], orig_hw: Sequence[float]) -> float:
    """r = min(H / h, W / w): the scale the letterbox applied to an (h, w) image for input (H, W)."""
    return min(img_size[0] / float(orig_hw[0]), img_size[1] / float(orig_hw[1]))


def to_original_coords(
    outputs: list[torch.Tensor | None], infos: Sequence[tuple[float, float]], img_size: Sequence[int]
) -> list[Detections]:
    """postprocess output (K, 7) [x1, y1, x2, y2, obj, cls_conf, cls] in input px -> (K, 6) per image.

    Boxes are divided by the letterbox ratio, so they are in original image pixels; score = obj * cls_conf.
    """
    result = []
    for out, hw in zip(outputs, infos):
        if out is None or len(out) == 0:
            result.append(np.zeros((0, 6), dtype=np.float64))
            continue
        out = out.detach().float().cpu().numpy().astype(np.float64)
        dets = np.empty((len(out), 6), dtype=np.float64)
        dets[:, :4] = out[:, :4] / letterbox_ratio(img_size, hw)
        dets[:, 4] = out[:, 4] * out[:, 5]
        dets[:, 5] = out[:, 6]
        result.append(dets)
    return result


class TimedDetections(NamedTuple):
    """What one batch gave: detections per image and the seconds its forward and its NMS took."""

    detections: list[Detections]
    forward_s: float
    nms_s: float


@torch.inference_mode()
def detect_batch(
    model: nn.Module,
    batch: torch.Tensor,
    orig_hw: Sequence[tuple[float, float]],
    img_size: Sequence[int],
    num_classes: int,
    conf: float,
    nms: float,
    amp_dtype: torch.dtype | None = None,
    class_agnostic: bool = False,
) -> TimedDetections:
    """Forward a letterboxed batch (B, 3, H, W) on the model's device, score filter + NMS (within each
    class, as COCO evaluation wants, or across classes when `class_agnostic`), boxes back to each image's
    original pixels (`orig_hw`: (h, w) per image); timed separately, synchronised on CUDA."""
    device = batch.device
    if isinstance(model, ExportedModel) and model.metadata.nms is not None:
        return _detect_with_graph_nms(model, batch, orig_hw, img_size, conf, nms, class_agnostic)
    # synced before each clock read: otherwise the forward's CUDA kernels would be timed as NMS time
    sync_device(device)
    t0 = time.perf_counter()
    with autocast(device, amp_dtype):
        outputs = model(batch)
    outputs = outputs.float()
    sync_device(device)
    t1 = time.perf_counter()
    kept = postprocess(outputs, num_classes, conf, nms, class_agnostic=class_agnostic)
    sync_device(device)
    t2 = time.perf_counter()
    return TimedDetections(to_original_coords(kept, orig_hw, img_size), t1 - t0, t2 - t1)


def _detect_with_graph_nms(
    model: ExportedModel,
    batch: torch.Tensor,
    orig_hw: Sequence[tuple[float, float]],
    img_size: Sequence[int],
    conf: float,
    nms: float,
    class_agnostic: bool,
) -> TimedDetections:
    """detect_batch for a file whose graph ends in NMS: its detections, those under `conf` dropped (as
    dropping them before NMS would: a box under the threshold suppresses only boxes under it); the whole
    call counts as forward time."""
    model.check_nms_settings(conf, nms, class_agnostic)
    t0 = time.perf_counter()
    kept = []
    for dets in model.detect(batch):  # (K, 6) [x1, y1, x2, y2, score, class] in input px
        dets = dets[dets[:, 4] >= conf]
        # postprocess's (K, 7) layout, the score as obj with a class confidence of 1
        kept.append(torch.cat([dets[:, :5], torch.ones_like(dets[:, :1]), dets[:, 5:]], dim=1))
    return TimedDetections(to_original_coords(kept, orig_hw, img_size), time.perf_counter() - t0, 0.0)


def model_device(model: nn.Module | ExportedModel) -> torch.device:
    """Where `model` takes its input: an exported model's device, else its parameters' device."""
    if isinstance(model, ExportedModel):
        return model.device
    return next(model.parameters()).device


def model_memory_format(model: nn.Module | ExportedModel) -> torch.memory_format:
    """The layout `model` wants its input in: channels_last when its convolutions' weights are NHWC (a
    contiguous input would be converted in front of every convolution), else contiguous."""
    if not isinstance(model, ExportedModel):
        for module in model.modules():
            if isinstance(module, nn.Conv2d) and module.weight.dim() == 4:
                if module.weight.is_contiguous(memory_format=torch.channels_last):
                    return torch.channels_last
                break
    return torch.contiguous_format


def load_inference_model(
    exp,
    ckpt_path: str | None,
    device: torch.device | str = "cpu",
    fuse: bool = False,
    channels_last: bool = False,
    random_weights: bool = False,
) -> tuple[nn.Module, tuple[str, ...]]:
    """exp's model in eval mode on `device` with the checkpoint's weights (strictly), and class names;
    `fuse`: BatchNorm folded into the convolutions; `channels_last`: NHWC weights (with `fuse`, 1.6-2x the
    images/s of nano on a CPU; outputs change by fp32 rounding only).

    Class names come from the checkpoint's "class_names" when it has them, else from the exp
    (`exp.get_class_names()`), else "0", "1", ... with a warning. `ckpt_path=None` is a ValueError naming
    the flag that asks for it, unless `random_weights`: then the model keeps its random initialisation (only
    useful to try a pipeline or time it; logged as a warning), so that a forgotten -c never ships a model
    that detects nothing.
    """
    if not ckpt_path and not random_weights:
        raise ValueError(NO_WEIGHTS)
    model = exp.get_model()
    ckpt: dict[str, Any] = {}
    if ckpt_path:
        ckpt = load_checkpoint(ckpt_path, map_location="cpu")
        try:
            # strict: a tensor silently left at its random init would make every figure meaningless
            load_model_weights(model, ckpt, strict=True)
        except CheckpointError as err:
            raise CheckpointError(
                f"{ckpt_path} does not fit the model of exp {exp.exp_name!r} (num_classes={exp.num_classes}, "
                f"depth={exp.depth}, width={exp.width}); set num_classes or pick the matching -f/-n.\n{err}"
            ) from err
        logger.info(f"loaded weights from {ckpt_path}")
    else:
        logger.warning("--random-weights: the model has RANDOM weights; its detections mean nothing")
    model.eval()
    if fuse:
        model = fuse_model(model)
    model.to(device, memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return model, resolve_class_names(exp, ckpt)


def resolve_class_names(exp, ckpt: dict[str, Any]) -> tuple[str, ...]:
    """Checkpoint's "class_names", else the exp's, else numbered names (warned)."""
    names = ckpt.get("class_names")
    if not names:
        try:
            names = exp.get_class_names()
        except (FileNotFoundError, ValueError, KeyError) as err:
            logger.warning(f"no class names in the checkpoint or the exp ({err}); using class indices")
            names = None
    if not names or len(names) != exp.num_classes:
        if names:
            logger.warning(f"{len(names)} class names for num_classes={exp.num_classes}; using class indices")
        names = [str(i) for i in range(exp.num_classes)]
    return tuple(str(n) for n in names)


class Predictor:
    """Batched detection on raw BGR uint8 images of any sizes.

    Each image is letterboxed to `test_size` (H, W) (as `data.augment.letterbox`) so a batch stacks into
    one (B, 3, H, W) tensor; `predict` returns, per image, (K, 6) [x1, y1, x2, y2, score, class] in that
    image's pixels. `forward_s` / `nms_s` / `num_images` accumulate timing for throughput reports.
    `amp_dtype`: autocast dtype (see utils.amp.amp_dtype), None for fp32.
    `class_agnostic`: NMS across classes, so one object gets one box (what a picture wants; official
    YOLOX's demo does the same); False: within each class, as evaluation does.
    `model`: a torch model in eval mode or an `ExportedModel` (no `channels_last` then).
    `channels_last` converts the model to NHWC memory format, which oneDNN (CPU) and tensor cores
    (CUDA) run faster (about 1.3x for nano on CPU), but whose kernels depend on the batch size: an
    image's boxes then differ between batch sizes by fp32 rounding (up to ~1e-3 px), whereas the
    default NCHW path gives the same boxes at any batch size up to float rounding.
    """

    def __init__(
        self,
        model: nn.Module | ExportedModel,
        num_classes: int,
        test_size: Sequence[int],
        conf: float,
        nms: float,
        device: torch.device | str = "cpu",
        amp_dtype: torch.dtype | None = None,
        channels_last: bool = False,
        class_agnostic: bool = False,
    ) -> None:
        self.model = model.eval()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        if isinstance(model, ExportedModel):
            if channels_last:
                raise ValueError("channels_last is for torch models: an exported layout is fixed")
        else:
            self.model.to(memory_format=self.memory_format)
        self.num_classes = num_classes
        self.test_size = tuple(test_size)
        self.conf = conf
        self.nms = nms
        self.device = torch.device(device)
        self.amp_dtype = amp_dtype
        self.class_agnostic = class_agnostic
        self.forward_s = 0.0
        self.nms_s = 0.0
        self.num_images = 0

    def compile(self, mode: str, batch_sizes: Iterable[int], backend: str = "inductor") -> CompileStats:
        """torch.compile the model (torch.compile's `mode` and `backend`) and build its graphs for
        `batch_sizes` now, on blank images down the path `predict` takes, so that the timing counters hold
        no compile time."""
        if isinstance(self.model, ExportedModel):
            raise ValueError("compile is for torch models: an exported file runs as exported")
        blank = np.zeros((*self.test_size, 3), dtype=np.uint8)

        def warm_up(n: int) -> None:
            self.predict([blank] * n)

        stats = compile_for_inference(self.model, mode, warm_up, batch_sizes, backend)
        self.forward_s, self.nms_s, self.num_images = 0.0, 0.0, 0
        return stats

    def letterbox_batch(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """(B, 3, H, W) float32 letterboxed batch on the device, in the model's memory format.

        Images are pasted as uint8 into one (B, H, W, 3) buffer and converted to float on the device:
        a quarter of the bytes to move, and no per-image float copy.
        """
        h, w = self.test_size
        batch = np.empty((len(images), h, w, 3), dtype=np.uint8)
        for i, img in enumerate(images):
            letterbox(img, self.test_size, out=batch[i])
        nchw_view = torch.from_numpy(batch).to(self.device, non_blocking=True).permute(0, 3, 1, 2)
        return nchw_view.contiguous(memory_format=self.memory_format).float()

    def predict(self, images: Sequence[np.ndarray]) -> list[Detections]:
        """Detections per image, (K, 6) float64 in original pixels (K may be 0)."""
        if not images:
            return []
        out = detect_batch(
            self.model,
            self.letterbox_batch(images),
            [img.shape[:2] for img in images],
            self.test_size,
            self.num_classes,
            self.conf,
            self.nms,
            self.amp_dtype,
            self.class_agnostic,
        )
        self.forward_s += out.forward_s
        self.nms_s += out.nms_s
        self.num_images += len(images)
        return out.detections
