"""Box math: the one pairwise IoU, the one aligned IoU, and YOLOX post-processing (score filter + NMS).

Formats: xyxy = (x1, y1, x2, y2); cxcywh = (cx, cy, w, h).
"""

from __future__ import annotations

import torch

__all__ = ["aligned_iou", "bboxes_iou", "cxcywh2xyxy", "postprocess"]


def cxcywh2xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) cx, cy, w, h -> x1, y1, x2, y2 (a new tensor)."""
    centre, half = boxes[..., :2], boxes[..., 2:] / 2
    return torch.cat([centre - half, centre + half], dim=-1)


def _corners(boxes: torch.Tensor, xyxy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # in float32 at least: in fp16 an area above 65504 px^2 (a 256 px square) is inf and the IoU NaN, and
    # the 1e-16 that keeps 0 / 0 away rounds to 0
    boxes = boxes.to(torch.promote_types(boxes.dtype, torch.float32))
    if xyxy:
        return boxes[..., :2], boxes[..., 2:]
    return boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2


def bboxes_iou(
    a: torch.Tensor,
    b: torch.Tensor,
    xyxy: bool = True,
    buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """IoU of every box of a (..., G, 4) with every box of b (..., U, 4) -> (..., G, U).

    Boxes are xyxy, or cxcywh with `xyxy=False` (then the arithmetic is YOLOX's `bboxes_iou(xyxy=False)`
    for proper boxes). The intersection is clamped at 0 and the union at the smallest normal float, so
    degenerate boxes give 0, not NaN. fp16 / bf16 boxes are computed and returned in float32. `buffers`:
    three tensors of the output's shape and dtype to compute in (the assigner reuses them across chunks);
    the result is the first one. Not differentiable.
    """
    if a.shape[-1] != 4 or b.shape[-1] != 4:
        raise ValueError(f"boxes must have 4 columns, got {tuple(a.shape)} and {tuple(b.shape)}")
    a_lo, a_hi = _corners(a, xyxy)
    b_lo, b_hi = _corners(b, xyxy)
    if buffers is None:
        shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-2])
        dtype = torch.promote_types(a_lo.dtype, b_lo.dtype)
        buffers = tuple(torch.empty(shape, dtype=dtype, device=a.device) for _ in range(3))
    inter, tmp, tmp2 = buffers
    torch.minimum(a_hi[..., :, None, 0], b_hi[..., None, :, 0], out=inter)
    inter.sub_(torch.maximum(a_lo[..., :, None, 0], b_lo[..., None, :, 0], out=tmp)).clamp_(min=0)
    torch.minimum(a_hi[..., :, None, 1], b_hi[..., None, :, 1], out=tmp)
    tmp.sub_(torch.maximum(a_lo[..., :, None, 1], b_lo[..., None, :, 1], out=tmp2)).clamp_(min=0)
    inter.mul_(tmp)
    area_a = (a_hi[..., 0] - a_lo[..., 0]) * (a_hi[..., 1] - a_lo[..., 1])
    area_b = (b_hi[..., 0] - b_lo[..., 0]) * (b_hi[..., 1] - b_lo[..., 1])
    torch.add(area_a[..., :, None], area_b[..., None, :], out=tmp).sub_(inter)  # union
    return inter.div_(tmp.clamp_(min=torch.finfo(tmp.dtype).tiny))


def aligned_iou(a: torch.Tensor, b: torch.Tensor, xyxy: bool = True, giou: bool = False) -> torch.Tensor:
    """IoU (or GIoU) of matching rows of a (..., 4) and b (..., 4) -> (...); differentiable.

    As YOLOX's IOUloss: union + 1e-16 in the denominator, GIoU's enclosing area clamped at 1e-16;
    zero-area boxes give 0. fp16 / bf16 boxes are computed and returned in float32.
    """
    a_lo, a_hi = _corners(a, xyxy)
    b_lo, b_hi = _corners(b, xyxy)
    inter = (torch.min(a_hi, b_hi) - torch.max(a_lo, b_lo)).clamp(min=0).prod(dim=-1)
    union = (a_hi - a_lo).prod(dim=-1) + (b_hi - b_lo).prod(dim=-1) - inter
    iou = inter / (union + 1e-16)
    if not giou:
        return iou
    enclosing = (torch.max(a_hi, b_hi) - torch.min(a_lo, b_lo)).prod(dim=-1)
    return iou - (enclosing - union) / enclosing.clamp(min=1e-16)


def postprocess(
    prediction: torch.Tensor,
    num_classes: int,
    conf_thre: float = 0.7,
    nms_thre: float = 0.45,
    class_agnostic: bool = False,
) -> list[torch.Tensor | None]:
    """YOLOX detections from decoded model output.

    prediction: (N, A, 5 + C) [cx, cy, w, h, obj, cls probs...]. A box is kept when
    obj * max class prob >= conf_thre, then NMS (per class unless `class_agnostic`) at IoU nms_thre,
    scored by obj * class prob. Returns per image a (K, 7) tensor
    [x1, y1, x2, y2, obj, cls_conf, cls_id] sorted by score (descending), or None if nothing is left.
    The input is not modified.
    """
    # imported here, not at the top: importing torchvision (its model zoo pulls in torch._dynamo)
    # takes seconds, which every tool process that never runs NMS (export, the dataset check, a run
    # stopped by a bad input) would otherwise pay at start
    import torchvision

    outputs: list[torch.Tensor | None] = [None] * prediction.shape[0]
    for i, pred in enumerate(prediction):
        if pred.shape[0] == 0:
            continue
        cls_conf, cls_id = pred[:, 5 : 5 + num_classes].max(dim=1, keepdim=True)  # (A, 1) each
        keep = pred[:, 4] * cls_conf[:, 0] >= conf_thre
        if not keep.any():
            continue
        dets = torch.cat([cxcywh2xyxy(pred[:, :4]), pred[:, 4:5], cls_conf, cls_id.to(pred.dtype)], dim=1)[
            keep
        ]
        scores = dets[:, 4] * dets[:, 5]
        if class_agnostic:
            kept = torchvision.ops.nms(dets[:, :4], scores, nms_thre)
        else:
            kept = torchvision.ops.batched_nms(dets[:, :4], scores, dets[:, 6], nms_thre)
        outputs[i] = dets[kept]
    return outputs
