"""The YOLOX training loss: SimOTA assignment, then IoU, objectness, class and (optionally) L1 losses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from yolox_fast.models.simota import simota_assign
from yolox_fast.utils import dist as dist_utils
from yolox_fast.utils.boxes import aligned_iou
from yolox_fast.utils.threads import single_threaded_on_cpu

IOU_LOSS_WEIGHT = 5.0  # YOLOX's reg_weight
# what `yolox_loss` returns that training logs and accumulates, in the progress line's order; "num_fg" is a
# per-ground-truth figure (averaged over accumulated batches, not weighted)
LOSS_KEYS = ("total_loss", "iou_loss", "l1_loss", "conf_loss", "cls_loss", "num_fg")
L1_EPS = 1e-8


class IOUloss(nn.Module):
    """YOLOX's box loss on cx, cy, w, h rows: "iou" -> 1 - IoU^2, "giou" -> 1 - clamp(GIoU, -1, 1).

    reduction: "none" (K,), "mean" or "sum".
    """

    def __init__(self, reduction: str = "none", loss_type: str = "iou"):
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"unknown reduction {reduction!r}")
        self.reduction = reduction
        self.loss_type = loss_type

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.loss_type not in ("iou", "giou"):
            raise ValueError(f"unknown IoU loss type {self.loss_type!r} (iou, giou)")
        iou = aligned_iou(
            pred.reshape(-1, 4), target.reshape(-1, 4), xyxy=False, giou=self.loss_type == "giou"
        )
        loss = 1 - iou**2 if self.loss_type == "iou" else 1 - iou.clamp(min=-1.0, max=1.0)
        if self.reduction == "mean":
            return loss.mean()
        if self.reduction == "sum":
            return loss.sum()
        return loss


_iou_loss = IOUloss(reduction="sum", loss_type="iou")


def yolox_loss(
    pred_boxes: torch.Tensor,
    obj_logits: torch.Tensor,
    cls_logits: torch.Tensor,
    raw_reg: torch.Tensor,
    grids: torch.Tensor,
    strides: torch.Tensor,
    labels: torch.Tensor,
    *,
    use_l1: bool,
    center_radius: float = 1.5,
    box_prior: bool = False,
    topk: int = 10,
    max_bytes: int | None = None,
    assigner=simota_assign,
) -> dict[str, torch.Tensor]:
    """YOLOX loss of a batch.

    pred_boxes (N, A, 4) decoded cx, cy, w, h px; obj_logits (N, A, 1); cls_logits (N, A, C) raw logits;
    raw_reg (N, A, 4) regression outputs before decoding; grids (A, 2) cell indices (x, y); strides (A,);
    labels (N, M, 5) [cls, cx, cy, w, h] px, padding rows all zero. Any float dtype; computed in fp32.
    `assigner`: the label assignment, `simota_assign` or anything with its signature (the per-image
    reference, for benchmarks); center_radius, box_prior, topk and max_bytes are passed on to it.

    Each loss is a sum over the batch divided by the foreground count F = max(F_all / world_size, 1),
    where F_all is the foreground count summed over DDP ranks. Under DDP's gradient averaging this is
    exactly sum-over-all-ranks / F_all, i.e. what one process with the whole batch would compute.
    Returns {"total_loss", "iou_loss", "conf_loss", "cls_loss", "l1_loss"} as 0-dim tensors, where
    iou_loss already carries YOLOX's weight 5 (total = iou_loss + conf_loss + cls_loss + l1_loss),
    "num_fg": foreground anchors per ground truth on this rank (the figure YOLOX logs), a float, and
    "fg_count": F_all / world_size before the clamp to 1 (0-dim tensor), with which gradient accumulation
    weights each batch so that several batches give the gradient of one batch of all their images.
    """
    device = pred_boxes.device
    # Small ops only (the big ones are the fg rows): one thread on CPU, see single_threaded_on_cpu.
    with torch.autocast(device.type, enabled=False), single_threaded_on_cpu(device):
        pred_boxes, obj_logits, cls_logits = pred_boxes.float(), obj_logits.float(), cls_logits.float()
        raw_reg, grids, strides, labels = raw_reg.float(), grids.float(), strides.float(), labels.float()
        num_classes = cls_logits.shape[-1]
        gt_mask = labels.sum(dim=2) > 0  # YOLOX: a label row is valid when it sums to > 0
        anchor_points = (grids + 0.5) * strides[:, None]
        assign = assigner(
            pred_boxes.detach(),
            cls_logits.detach(),
            obj_logits.detach(),
            anchor_points,
            strides,
            labels[..., 1:5],
            labels[..., 0].long(),
            gt_mask,
            center_radius=center_radius,
            box_prior=box_prior,
            topk=topk,
            max_bytes=max_bytes,
        )
        fg = assign.fg_mask  # (N, A)
        img_idx, anchor_idx = fg.nonzero(as_tuple=True)
        matched = labels[img_idx, assign.matched_gt[img_idx, anchor_idx]]  # (F, 5)
        box_target = matched[:, 1:5]
        cls_target = F.one_hot(matched[:, 0].long(), num_classes).float() * assign.matched_iou[fg][:, None]

        num_fg_all = dist_utils.all_reduce_sum(torch.tensor(float(assign.num_fg), device=device))
        normaliser = torch.clamp(num_fg_all / dist_utils.get_world_size(), min=1.0)

        iou_loss = _iou_loss(pred_boxes[fg], box_target) / normaliser
        conf_loss = (
            F.binary_cross_entropy_with_logits(obj_logits.reshape(fg.shape), fg.float(), reduction="sum")
            / normaliser
        )
        cls_loss = (
            F.binary_cross_entropy_with_logits(cls_logits[fg], cls_target, reduction="sum") / normaliser
        )
        if use_l1:
            stride = strides[anchor_idx, None]
            l1_target = torch.cat(
                [
                    box_target[:, :2] / stride - grids[anchor_idx],
                    torch.log(box_target[:, 2:] / stride + L1_EPS),
                ],
                dim=1,
            )
            l1_loss = F.l1_loss(raw_reg[fg], l1_target, reduction="sum") / normaliser
        else:
            l1_loss = torch.zeros((), device=device)
        iou_loss = IOU_LOSS_WEIGHT * iou_loss
        total = iou_loss + conf_loss + cls_loss + l1_loss
    num_gt = int(gt_mask.sum())
    return {
        "total_loss": total,
        "iou_loss": iou_loss,
        "conf_loss": conf_loss,
        "cls_loss": cls_loss,
        "l1_loss": l1_loss,
        "num_fg": assign.num_fg / max(num_gt, 1),
        "fg_count": num_fg_all / dist_utils.get_world_size(),
    }


@dataclass(frozen=True)
class YOLOXLoss:
    """The head's loss function: `yolox_loss` with its SimOTA settings, given to YOLOXHead once
    (`exp.get_model` builds it from the exp's simota_* fields).

    `loss(pred_boxes, obj_logits, cls_logits, raw_reg, grids, strides, labels, use_l1=...)`; the
    settings are `yolox_loss`'s: center_radius, box_prior, topk, max_bytes, and the assigner (the
    per-image reference in benchmarks: `dataclasses.replace(loss, assigner=...)`).
    """

    center_radius: float = 1.5
    box_prior: bool = False
    topk: int = 10
    max_bytes: int | None = None
    assigner: Callable = simota_assign

    def __call__(self, *inputs: torch.Tensor, use_l1: bool) -> dict[str, torch.Tensor]:
        return yolox_loss(
            *inputs,
            use_l1=use_l1,
            center_radius=self.center_radius,
            box_prior=self.box_prior,
            topk=self.topk,
            max_bytes=self.max_bytes,
            assigner=self.assigner,
        )
