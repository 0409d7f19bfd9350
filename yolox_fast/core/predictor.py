"""Inference on raw images: load a model for inference, then letterbox + forward + NMS in batches.

Used by tools/demo.py, tools/eval.py, tools/export_onnx.py and the demo benchmark.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.data.augment import PAD_VALUE, resize_keep_ratio
from yolox_fast.evaluators.inference import Detections, autocast_context, to_original_coords
from yolox_fast.utils.boxes import fuse_model, postprocess
from yolox_fast.utils.checkpoint import load_checkpoint, load_model_weights


def load_inference_model(
    exp, ckpt_path: Optional[str], device: torch.device | str = "cpu", fuse: bool = False
) -> Tuple[nn.Module, Tuple[str, ...]]:
    """exp's model in eval mode on `device` with the checkpoint's weights (strictly), and class names.

    Class names come from the checkpoint's "class_names" when it has them, else from the exp
    (`exp.get_class_names()`), else "0", "1", ... with a warning. `ckpt_path=None` keeps the random
    initialisation (only useful to try a pipeline; logged as a warning).
    """
    model = exp.get_model()
    ckpt: Dict[str, Any] = {}
    if ckpt_path:
        ckpt = load_checkpoint(ckpt_path, map_location="cpu")
        try:
            # strict: a tensor silently left at its random init would make every figure meaningless
            load_model_weights(model, ckpt, strict=True)
        except RuntimeError as err:
            raise RuntimeError(
                f"{ckpt_path} does not fit the model of exp {exp.exp_name!r} (num_classes={exp.num_classes}, "
                f"depth={exp.depth}, width={exp.width}); set num_classes or pick the matching -f/-n.\n{err}"
            ) from err
        logger.info(f"loaded weights from {ckpt_path}")
    else:
        logger.warning("no checkpoint given (-c): the model has RANDOM weights; its detections mean nothing")
    model.eval()
    if fuse:
        model = fuse_model(model)
    model.to(device)
    return model, resolve_class_names(exp, ckpt)


def resolve_class_names(exp, ckpt: Dict[str, Any]) -> Tuple[str, ...]:
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

    Each image is letterboxed to `test_size` (H, W) (as `data.augment.preproc`) so a batch stacks into
    one (B, 3, H, W) tensor; `predict` returns, per image, (K, 6) [x1, y1, x2, y2, score, class] in that
    image's pixels. `forward_s` / `nms_s` / `num_images` accumulate timing for throughput reports.
    `channels_last` converts the model to NHWC memory format, which oneDNN (CPU) and tensor cores
    (CUDA) run faster (about 1.3x for nano on CPU), but whose kernels depend on the batch size: an
    image's boxes then differ between batch sizes by fp32 rounding (up to ~1e-3 px), whereas the
    default NCHW path gives the same boxes at any batch size (within 1e-4 px).
    """

    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        test_size: Sequence[int],
        conf: float,
        nms: float,
        device: torch.device | str = "cpu",
        half: bool = False,
        channels_last: bool = False,
    ) -> None:
        self.model = model.eval()
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.model.to(memory_format=self.memory_format)
        self.num_classes = num_classes
        self.test_size = tuple(test_size)
        self.conf = conf
        self.nms = nms
        self.device = torch.device(device)
        self.half = half
        self.forward_s = 0.0
        self.nms_s = 0.0
        self.num_images = 0

    def preprocess(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """(B, 3, H, W) float32 letterboxed batch on the device, in the model's memory format.

        Images are pasted as uint8 into one (B, H, W, 3) buffer and converted to float on the device:
        a quarter of the bytes to move, and no per-image float copy.
        """
        h, w = self.test_size
        batch = np.full((len(images), h, w, 3), PAD_VALUE, dtype=np.uint8)
        for i, img in enumerate(images):
            resized, _ = resize_keep_ratio(img, self.test_size)
            batch[i, : resized.shape[0], : resized.shape[1]] = resized
        nchw_view = torch.from_numpy(batch).to(self.device, non_blocking=True).permute(0, 3, 1, 2)
        return nchw_view.contiguous(memory_format=self.memory_format).float()

    @torch.inference_mode()
    def predict(self, images: Sequence[np.ndarray]) -> List[Detections]:
        """Detections per image, (K, 6) float64 in original pixels (K may be 0)."""
        if not images:
            return []
        batch = self.preprocess(images)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        with autocast_context(self.device, self.half):
            outputs = self.model(batch)
        outputs = outputs.float()
        sync()
        t1 = time.perf_counter()
        outputs = postprocess(outputs, self.num_classes, self.conf, self.nms)
        sync()
        self.forward_s += t1 - t0
        self.nms_s += time.perf_counter() - t1
        self.num_images += len(images)
        return to_original_coords(outputs, [img.shape[:2] for img in images], self.test_size)
