"""Box utilities: format conversions, IoU, YOLOX post-processing (score filter + NMS), conv-BN folding.

Formats: xyxy = (x1, y1, x2, y2); cxcywh = (cx, cy, w, h); xywh = (x1, y1, w, h) (COCO json).
Conversions accept torch tensors or numpy arrays of shape (..., 4) and return a new array.
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision
from torch import nn

__all__ = [
    "bboxes_iou",
    "cxcywh2xyxy",
    "elementwise_iou",
    "fuse_conv_and_bn",
    "fuse_model",
    "postprocess",
    "xywh2xyxy",
    "xyxy2cxcywh",
    "xyxy2xywh",
]


def _stack(cols, like):
    if isinstance(like, torch.Tensor):
        return torch.stack(cols, dim=-1)
    return np.stack(cols, axis=-1)


def xyxy2cxcywh(boxes):
    """(..., 4) x1, y1, x2, y2 -> cx, cy, w, h."""
    x1, y1, x2, y2 = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    return _stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], boxes)


def cxcywh2xyxy(boxes):
    """(..., 4) cx, cy, w, h -> x1, y1, x2, y2."""
    cx, cy, w, h = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    return _stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], boxes)


def xyxy2xywh(boxes):
    """(..., 4) x1, y1, x2, y2 -> x1, y1, w, h (COCO result format)."""
    x1, y1, x2, y2 = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    return _stack([x1, y1, x2 - x1, y2 - y1], boxes)


def xywh2xyxy(boxes):
    """(..., 4) x1, y1, w, h -> x1, y1, x2, y2."""
    x1, y1, w, h = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    return _stack([x1, y1, x1 + w, y1 + h], boxes)


def _as_xyxy(boxes: torch.Tensor, xyxy: bool) -> torch.Tensor:
    return boxes if xyxy else cxcywh2xyxy(boxes)


def _iou_from_corners(tl: torch.Tensor, br: torch.Tensor, area_a: torch.Tensor, area_b: torch.Tensor):
    inter = (br - tl).clamp(min=0).prod(dim=-1)
    union = area_a + area_b - inter
    # zero-area boxes (padding, degenerate labels) get IoU 0 rather than NaN
    return inter / union.clamp(min=torch.finfo(union.dtype).eps)


def bboxes_iou(bboxes_a: torch.Tensor, bboxes_b: torch.Tensor, xyxy: bool = True) -> torch.Tensor:
    """Pairwise IoU: (A, 4), (B, 4) -> (A, B). Boxes are xyxy, or cxcywh when `xyxy=False`."""
    if bboxes_a.shape[-1] != 4 or bboxes_b.shape[-1] != 4:
        raise ValueError(
            f"boxes must have 4 columns, got {tuple(bboxes_a.shape)} and {tuple(bboxes_b.shape)}"
        )
    a = _as_xyxy(bboxes_a, xyxy)
    b = _as_xyxy(bboxes_b, xyxy)
    tl = torch.max(a[:, None, :2], b[None, :, :2])  # (A, B, 2)
    br = torch.min(a[:, None, 2:], b[None, :, 2:])
    area_a = (a[:, 2:] - a[:, :2]).prod(dim=1)
    area_b = (b[:, 2:] - b[:, :2]).prod(dim=1)
    return _iou_from_corners(tl, br, area_a[:, None], area_b[None, :])


def elementwise_iou(bboxes_a: torch.Tensor, bboxes_b: torch.Tensor, xyxy: bool = True) -> torch.Tensor:
    """IoU of matching rows: (..., 4), (..., 4) -> (...). Boxes are xyxy, or cxcywh when `xyxy=False`."""
    a = _as_xyxy(bboxes_a, xyxy)
    b = _as_xyxy(bboxes_b, xyxy)
    tl = torch.max(a[..., :2], b[..., :2])
    br = torch.min(a[..., 2:], b[..., 2:])
    area_a = (a[..., 2:] - a[..., :2]).prod(dim=-1)
    area_b = (b[..., 2:] - b[..., :2]).prod(dim=-1)
    return _iou_from_corners(tl, br, area_a, area_b)


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


def fuse_conv_and_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A Conv2d (with bias) computing bn(conv(x)) with the BN's running statistics (eval semantics)."""
    fused = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        kernel_size=conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
        bias=True,
    ).to(device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        # computed in fp32 (or wider) so half models do not lose precision in 1/sqrt(var)
        work = torch.promote_types(conv.weight.dtype, torch.float32)
        scale = bn.weight.to(work) / torch.sqrt(bn.running_var.to(work) + bn.eps)  # (Cout,)
        fused.weight.copy_((conv.weight.to(work) * scale[:, None, None, None]).to(conv.weight.dtype))
        conv_bias = conv.bias.to(work) if conv.bias is not None else torch.zeros_like(scale)
        bias = (conv_bias - bn.running_mean.to(work)) * scale + bn.bias.to(work)
        fused.bias.copy_(bias.to(conv.weight.dtype))
    fused.requires_grad_(conv.weight.requires_grad)
    return fused


def fuse_model(model: nn.Module) -> nn.Module:
    """Fold every BaseConv's BatchNorm into its conv (in place) for faster inference; returns `model`.

    Only for inference: the folded BN no longer adapts to batch statistics in training mode.
    """
    from yolox_fast.models.network_blocks import BaseConv

    for m in model.modules():
        if isinstance(m, BaseConv) and isinstance(m.bn, nn.BatchNorm2d):
            m.conv = fuse_conv_and_bn(m.conv, m.bn)
            m.bn = nn.Identity()
    return model
