"""DetectionEvaluator: what the COCO and VOC evaluators share.

Batched inference over the eval loader (`inference.detect_batch`: forward, NMS, boxes back to
original pixels) and the distributed protocol: each rank its own shard, everything gathered to rank 0,
rank 0 scores, the result broadcast so every rank returns the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from loguru import logger

from yolox_fast.inference.predictor import Detections, detect_batch, model_device, model_memory_format
from yolox_fast.utils import dist as dist_utils
from yolox_fast.utils.amp import amp_dtype
from yolox_fast.utils.compile import run_batch_sizes
from yolox_fast.utils.progress import Progress


@dataclass
class InferenceResult:
    """What one pass over (a shard of) the eval set produced."""

    detections: dict[Any, Detections] = field(default_factory=dict)  # image id -> (K, 6)
    forward_s: float = 0.0  # model forward time, summed over batches
    nms_s: float = 0.0  # postprocess (confidence filter + NMS) time, summed
    num_images: int = 0

    def timing_text(self) -> str:
        n = max(self.num_images, 1)
        fwd, nms = 1000 * self.forward_s / n, 1000 * self.nms_s / n
        return (
            f"Average forward time: {fwd:.2f} ms, Average NMS time: {nms:.2f} ms, "
            f"Average inference time: {fwd + nms:.2f} ms (per image, {self.num_images} images)"
        )


def _split_info(img_info: Any, batch_size: int) -> list[tuple[float, float]]:
    """(orig_h, orig_w) per image from whatever the default collate made of the per-item tuples.

    Default collate turns B tuples (h, w) into [h (B,), w (B,)]; a custom collate may keep a list of
    B tuples, or stack into a (B, 2) tensor.
    """
    if isinstance(img_info, torch.Tensor) and img_info.dim() == 2:
        return [(float(h), float(w)) for h, w in img_info.tolist()]
    if (
        isinstance(img_info, (list, tuple))
        and len(img_info) == 2
        and all(isinstance(x, (torch.Tensor, np.ndarray)) and np.ndim(x) == 1 for x in img_info)
    ):
        hs, ws = (np.asarray(x, dtype=np.float64) for x in img_info)
        return list(zip(hs.tolist(), ws.tolist()))
    infos = [(float(x[0]), float(x[1])) for x in img_info]
    if len(infos) != batch_size:
        raise ValueError(f"img_info has {len(infos)} entries for a batch of {batch_size}")
    return infos


def _split_ids(img_ids: Any) -> list[Any]:
    """Image ids as plain Python scalars (ints for numeric ids, so they pickle and hash simply)."""
    if isinstance(img_ids, (torch.Tensor, np.ndarray)):
        return [x.item() if hasattr(x, "item") else x for x in np.asarray(img_ids).reshape(-1)]
    return [x.item() if hasattr(x, "item") else x for x in img_ids]


def top_per_class(dets: Detections, k: int) -> Detections:
    """The rows of `dets` (K, 6) [x1, y1, x2, y2, score, class] among the `k` best-scored of their class,
    in their original order.

    Within a class, rows are ranked by score with ties in row order: the stable sort COCOeval applies to
    each image's detections of one category before it keeps the first maxDets (= k). The rows kept here
    are those it keeps, in the same order, so it computes the same matches and the same AP from them.
    """
    if len(dets) <= k:
        return dets
    by_score = np.argsort(-dets[:, 4], kind="stable")  # (K,) best first, ties in row order
    cls = dets[by_score, 5]
    by_class = np.argsort(cls, kind="stable")  # groups each class, best first within it
    sorted_cls = cls[by_class]
    starts = np.flatnonzero(np.r_[True, sorted_cls[1:] != sorted_cls[:-1]])
    rank = np.arange(len(dets)) - np.repeat(starts, np.diff(np.r_[starts, len(dets)]))  # rank in class
    keep = np.zeros(len(dets), dtype=bool)
    keep[by_score[by_class[rank < k]]] = True
    return dets[keep]


def run_inference(
    model: nn.Module,
    dataloader: Iterable,
    img_size: Sequence[int],
    num_classes: int,
    confthre: float,
    nmsthre: float,
    half: bool = False,
    max_per_class: int | None = None,
) -> InferenceResult:
    """Detections of `model` for every image of this rank's loader (B images per forward).

    The loader yields (imgs (B, 3, H, W) float32 letterboxed to `img_size`, targets, img_info
    (orig_h, orig_w) per image, img_ids); `model` is a torch model or an `ExportedModel`. `half`: autocast
    (fp16 on CUDA, bf16 on CPU). `max_per_class`: each image keeps the best that many of each class
    (`top_per_class`). The model is put in eval mode and left there.
    """
    model.eval()
    device, memory_format = model_device(model), model_memory_format(model)
    dtype = amp_dtype(device, fp16=half)
    result = InferenceResult()
    # rank 0 shows its own shard's progress (the shards are of equal size), the other ranks stay quiet
    progress = Progress("eval", _num_images(dataloader), enabled=dist_utils.get_rank() == 0)
    for imgs, _, img_info, img_ids in dataloader:
        ids = _split_ids(img_ids)
        infos = _split_info(img_info, len(ids))
        imgs = imgs.to(device, non_blocking=True).float().contiguous(memory_format=memory_format)
        out = detect_batch(model, imgs, infos, img_size, num_classes, confthre, nmsthre, dtype)
        result.forward_s += out.forward_s
        result.nms_s += out.nms_s
        result.num_images += len(ids)
        for img_id, dets in zip(ids, out.detections):
            if img_id in result.detections:
                raise RuntimeError(f"image id {img_id!r} appears twice in this rank's eval loader")
            result.detections[img_id] = dets if max_per_class is None else top_per_class(dets, max_per_class)
        progress.step(len(ids))
    return result


def _num_images(dataloader: Iterable) -> int:
    """Images this rank's loader yields: its sampler's length (a shard), else its dataset's."""
    for part in (getattr(dataloader, "sampler", None), getattr(dataloader, "dataset", None)):
        if part is not None and hasattr(part, "__len__"):
            return len(part)
    return 0


def batch_sizes(dataloader) -> list[int]:
    """The batch sizes this rank's loader yields: its batch size, and the smaller last batch if any."""
    return run_batch_sizes(_num_images(dataloader), dataloader.batch_size)


def gather_inference(local: InferenceResult) -> InferenceResult | None:
    """Merge every rank's result on rank 0 (None on the other ranks).

    Raises on rank 0 if two ranks evaluated the same image: the eval sampler must shard without
    padding, otherwise duplicated images would be scored twice. `evaluate_on_all_ranks` calls this
    so that such an error reaches every rank instead of leaving them waiting.
    """
    parts = dist_utils.gather_object(local)
    if parts is None:
        return None
    merged = InferenceResult()
    for rank, part in enumerate(parts):
        dupes = merged.detections.keys() & part.detections.keys()
        if dupes:
            raise RuntimeError(
                f"rank {rank} evaluated {len(dupes)} image(s) another rank also evaluated "
                f"(e.g. {sorted(dupes, key=str)[:3]}): the eval loader must give each rank a disjoint shard"
            )
        merged.detections.update(part.detections)
        merged.forward_s += part.forward_s
        merged.nms_s += part.nms_s
        merged.num_images += part.num_images
    return merged


def evaluate_on_all_ranks(
    infer_fn: Callable[[], InferenceResult], score_fn: Callable[[InferenceResult], Any], distributed: bool
) -> Any:
    """Run `infer_fn` on every rank, gather to rank 0, `score_fn(merged)` there; its value on every rank.

    A failure on any rank, in inference (a bad image, out of memory) or in scoring on rank 0
    (duplicate images, pycocotools), is made known to every rank, which all raise RuntimeError naming
    it: no rank is left blocked in a collective the others will never join. With `distributed`
    False (or no process group) this process scores its own loader alone, and the original
    exception propagates unchanged.
    """
    if not (distributed and dist_utils.is_distributed()):
        local = infer_fn()
        return score_fn(local)

    local, error = None, None
    try:
        local = infer_fn()
    except Exception as err:  # noqa: BLE001 -- shared with every rank below, then raised everywhere
        error = f"rank {dist_utils.get_rank()}: {type(err).__name__}: {err}"
    errors = [e for e in dist_utils.all_gather_object(error) if e]
    if errors:
        raise RuntimeError("evaluation failed during inference on " + "; ".join(errors))

    status, payload = "ok", None
    try:
        merged = gather_inference(local)
        if merged is not None:
            payload = score_fn(merged)
    except Exception as err:  # noqa: BLE001 -- forwarded to every rank below, then re-raised
        status, payload = "error", f"{type(err).__name__}: {err}"
    status, payload = dist_utils.broadcast_object((status, payload), src=0)
    if status == "error":
        raise RuntimeError(f"evaluation failed on rank 0: {payload}")
    return payload


def check_not_empty(dataloader: Any) -> None:
    """An empty eval set would report AP 0 as if the model were useless: make it an error instead."""
    dataset = getattr(dataloader, "dataset", None)
    if dataset is not None and len(dataset) == 0:
        raise ValueError(
            "the eval set is empty: check the dataset description's val split (images / ann / sets)"
        )


class DetectionEvaluator:
    """What every evaluator shares: batched inference over the loader (one shard per rank),
    gathering to rank 0, timing, and the speed-only shortcut. A subclass scores the merged
    detections in `score` and returns a dict with at least ap50_95, ap50 and summary.

    After `evaluate`, `self.last_result` holds the full result dict on every rank, and
    `self.last_merged` the merged detections on the rank that scored them (rank 0; None elsewhere):
    what `evaluators.report` turns into tables and pictures without a second gather.
    """

    def __init__(
        self,
        dataloader,
        img_size: Sequence[int],
        confthre: float,
        nmsthre: float,
        num_classes: int,
        class_names: Sequence[str] | None = None,
    ) -> None:
        self.dataloader = dataloader
        self.img_size = tuple(img_size)
        self.confthre = confthre
        self.nmsthre = nmsthre
        self.num_classes = num_classes
        self.class_names = class_names
        self.last_result: dict[str, Any] = {}
        self.last_merged: InferenceResult | None = None
        # the detections per image and class the metric can use (None: all of them); see top_per_class
        self.max_per_class: int | None = None

    def evaluate(
        self, model: nn.Module, distributed: bool = False, half: bool = False, speed_only: bool = False
    ) -> tuple[float, float, str]:
        """(ap50_95, ap50, summary text) on the whole eval set; the same values on every rank.

        `distributed`: this rank's loader holds one shard; detections are gathered to rank 0, scored
        there once, and the result broadcast. `half`: autocast (fp16 on CUDA, bf16 on CPU).
        `speed_only`: time inference, skip scoring (returns 0, 0 and the timing line).
        The model is left in eval mode.
        """
        check_not_empty(self.dataloader)
        self.last_merged = None
        self.last_result = evaluate_on_all_ranks(
            lambda: run_inference(
                model,
                self.dataloader,
                self.img_size,
                self.num_classes,
                self.confthre,
                self.nmsthre,
                half,
                self.max_per_class,
            ),
            lambda merged: self._score_with_timing(merged, speed_only),
            distributed,
        )
        return self.last_result["ap50_95"], self.last_result["ap50"], self.last_result["summary"]

    def _score_with_timing(self, merged: InferenceResult, speed_only: bool) -> dict[str, Any]:
        timing = merged.timing_text()
        logger.info(timing)
        base = {"num_images": len(merged.detections), "timing": timing}
        if speed_only:
            return {**base, "ap50_95": 0.0, "ap50": 0.0, "summary": timing + "\n"}
        self.last_merged = merged
        result = self.score(merged)
        return {**base, **result, "summary": f"{timing}\n{result['summary']}"}

    def score(self, merged: InferenceResult) -> dict[str, Any]:
        raise NotImplementedError
