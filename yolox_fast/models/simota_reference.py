"""The per-image, per-GT SimOTA loop, written like official YOLOX: the oracle `simota_assign` is tested
against and the baseline the benchmarks time it against. Not used in training.

It shares no arithmetic with `models/simota.py` (only the result's type): the IoU, the class score, the input
checks and the window penalty are written out here again, plainly, so that a bug in the batched assigner's
helpers shows up as a difference from this loop instead of being in both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from yolox_fast.models.simota import SimOTAResult


def pairwise_iou_cxcywh(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU (G, U) of every box of a (G, 4) with every box of b (U, 4), both cx, cy, w, h, float32: the
    overlap of the corner boxes over their union (the union at least the smallest normal float, so that
    empty boxes give 0)."""
    a_lo, a_hi = a[:, :2] - a[:, 2:] / 2, a[:, :2] + a[:, 2:] / 2  # (G, 2) top-left, bottom-right
    b_lo, b_hi = b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2  # (U, 2)
    overlap = (torch.min(a_hi[:, None], b_hi[None]) - torch.max(a_lo[:, None], b_lo[None])).clamp(min=0)
    inter = overlap[..., 0] * overlap[..., 1]  # (G, U)
    area_a = (a_hi[:, 0] - a_lo[:, 0]) * (a_hi[:, 1] - a_lo[:, 1])  # (G,)
    area_b = (b_hi[:, 0] - b_lo[:, 0]) * (b_hi[:, 1] - b_lo[:, 1])  # (U,)
    union = area_a[:, None] + area_b[None] - inter
    return inter / union.clamp(min=torch.finfo(union.dtype).tiny)


@torch.no_grad()
def simota_assign_reference(
    pred_boxes: torch.Tensor,
    cls_logits: torch.Tensor,
    obj_logits: torch.Tensor,
    anchor_points: torch.Tensor,
    strides: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_classes: torch.Tensor,
    gt_mask: torch.Tensor,
    *,
    center_radius: float = 1.5,
    box_prior: bool = False,
    topk: int = 10,
    iou_weight: float = 3.0,
    max_bytes: int | None = None,
) -> SimOTAResult:
    """Per-image, per-GT SimOTA written like official YOLOX (explicit (G, U, C) BCE; 0.3.0's
    `get_in_boxes_info` with the box prior); same I/O as `simota_assign` (`max_bytes` is accepted and
    ignored). For tests and benchmarks."""
    del max_bytes
    penalty = 1e5 if box_prior else 1e6  # outside a GT's window: YOLOX 0.3.0's, the later YOLOX's
    with torch.autocast(pred_boxes.device.type, enabled=False):
        num_images, num_anchors, num_classes = cls_logits.shape
        if 100.0 * num_classes + iou_weight * 18.5 >= penalty:  # each BCE term is at most 100
            raise ValueError(
                f"SimOTA's {penalty:g} window penalty is not dominant with {num_classes} classes"
            )
        pred_boxes = pred_boxes.float()
        obj_logits = obj_logits.reshape(num_images, num_anchors).float()
        gt_boxes = gt_boxes.float()
        gt_valid = gt_mask.bool() & torch.isfinite(gt_boxes).all(-1)  # (N, G)
        out_of_range = gt_valid & ((gt_classes < 0) | (gt_classes >= num_classes))
        if bool(out_of_range.any()):
            ids = gt_classes[out_of_range].unique().tolist()
            raise ValueError(f"ground-truth class ids outside [0, {num_classes}): {ids}")
        device = pred_boxes.device
        fg_mask = torch.zeros(num_images, num_anchors, dtype=torch.bool, device=device)
        matched_gt = torch.zeros(num_images, num_anchors, dtype=torch.long, device=device)
        matched_iou = torch.zeros(num_images, num_anchors, dtype=torch.float32, device=device)
        ax, ay = anchor_points[:, 0].float(), anchor_points[:, 1].float()
        center_dist = strides.float() * center_radius  # (A,)
        for n in range(num_images):
            gt_idx = gt_valid[n].nonzero()[:, 0]
            if gt_idx.numel() == 0:
                continue
            gt = gt_boxes[n, gt_idx]  # (G, 4)
            # Official window test: every centre delta strictly positive.
            deltas = torch.stack(
                [
                    ax - (gt[:, 0:1] - center_dist),
                    ay - (gt[:, 1:2] - center_dist),
                    (gt[:, 0:1] + center_dist) - ax,
                    (gt[:, 1:2] + center_dist) - ay,
                ],
                dim=2,
            )  # (G, A, 4)
            in_window = deltas.min(dim=-1).values > 0.0  # (G, A)
            is_candidate = in_window.any(dim=0)  # (A,)
            if box_prior:  # 0.3.0: candidates in any box or window; the cost-free region is box AND window
                half = gt[:, 2:4] / 2
                box_deltas = torch.stack(
                    [
                        ax - (gt[:, 0:1] - half[:, 0:1]),
                        ay - (gt[:, 1:2] - half[:, 1:2]),
                        (gt[:, 0:1] + half[:, 0:1]) - ax,
                        (gt[:, 1:2] + half[:, 1:2]) - ay,
                    ],
                    dim=2,
                )
                in_box = box_deltas.min(dim=-1).values > 0.0  # (G, A)
                is_candidate = is_candidate | in_box.any(dim=0)
                in_window = in_window & in_box
            if not bool(is_candidate.any()):
                continue
            window = in_window[:, is_candidate]  # (G, U)
            anchors = is_candidate.nonzero()[:, 0]  # (U,)
            boxes = pred_boxes[n, anchors]
            # YOLOX's joint score sqrt(sigmoid(cls) * sigmoid(obj)) (U, C)
            p = (cls_logits[n, anchors].float().sigmoid() * obj_logits[n, anchors, None].sigmoid()).sqrt()
            bad = torch.isnan(p).any(dim=1) | ~torch.isfinite(boxes).all(dim=1)
            p[bad] = 0.0  # any value in [0, 1]; their cost is set to inf below
            ious = pairwise_iou_cxcywh(gt, boxes)  # (G, U)
            ious[:, bad] = 0.0
            num_gt, num_cand = ious.shape
            onehot = F.one_hot(gt_classes[n, gt_idx].long(), num_classes).float()
            # Materialised (G, U, C) like YOLOX: the memory the batched version avoids.
            cls_cost = F.binary_cross_entropy(
                p.unsqueeze(0).repeat(num_gt, 1, 1),
                onehot.unsqueeze(1).repeat(1, num_cand, 1),
                reduction="none",
            ).sum(-1)
            cost = cls_cost + iou_weight * -torch.log(ious + 1e-8) + penalty * (~window)
            cost[:, bad] = float("inf")

            top_ious = torch.topk(ious, min(topk, num_cand), dim=1).values
            dynamic_k = torch.clamp(top_ious.sum(1).int(), min=1)
            matching = torch.zeros_like(cost, dtype=torch.bool)
            for g in range(num_gt):
                _, pos = torch.topk(cost[g], k=int(dynamic_k[g]), largest=False)
                matching[g, pos[torch.isfinite(cost[g, pos])]] = True
            takers = matching.sum(0)
            multiple = takers > 1
            if bool(multiple.any()):
                _, cost_argmin = torch.min(cost[:, multiple], dim=0)
                matching[:, multiple] = False
                matching[cost_argmin, multiple] = True
            fg = takers > 0
            owner = matching[:, fg].int().argmax(0)
            fg_anchors = anchors[fg]
            fg_mask[n, fg_anchors] = True
            matched_gt[n, fg_anchors] = gt_idx[owner]
            matched_iou[n, fg_anchors] = ious[owner, fg.nonzero()[:, 0]]
        return SimOTAResult(fg_mask, matched_gt, matched_iou, int(fg_mask.sum()))
