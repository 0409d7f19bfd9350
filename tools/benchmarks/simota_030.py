"""SimOTA as the released YOLOX 0.3.0 assigns, with yolox_fast's assigner interface (a test oracle).

yolox_fast's `simota_assign` follows the later YOLOX rule (candidates: anchors within 1.5 strides of a
GT centre; 1e6 added to the cost outside that window). The released 0.3.0 (yolox/models/yolo_head.py,
`get_in_boxes_info` and `get_assignments`) differs in the candidates and in the penalty region:

- candidates of an image: anchors whose centre lies strictly inside any GT box, or strictly within
  2.5 strides (a square window) of any GT centre;
- cost[g, u] = class BCE + 3 * -log(IoU + 1e-8) + 1e5 unless u is inside g's box AND g's window.

Dynamic k (the sum of the top-10 candidate IoUs, at least 1), the choice of the k cheapest candidates
and the resolution of an anchor claimed by several GTs (lowest cost wins) are as in yolox_fast. Passing
this as the `assigner` of `yolox_fast.models.losses.yolox_loss` reproduces 0.3.0's loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from yolox_fast.models.simota import SimOTAResult
from yolox_fast.utils.boxes import bboxes_iou

CENTER_RADIUS_030 = 2.5
PENALTY_030 = 100000.0


@torch.no_grad()
def simota_assign_030(
    pred_boxes,
    cls_logits,
    obj_logits,
    anchor_points,
    strides,
    gt_boxes,
    gt_classes,
    gt_mask,
    *,
    center_radius=None,
    topk=10,
    max_bytes=None,
    iou_weight=3.0,
) -> SimOTAResult:
    """Same inputs and result as `yolox_fast.models.simota.simota_assign`; `center_radius` and
    `max_bytes` are ignored (0.3.0 fixes the radius at 2.5)."""
    del center_radius, max_bytes
    if obj_logits.dim() == 3:
        obj_logits = obj_logits[..., 0]
    num_images, num_anchors, num_classes = cls_logits.shape
    device = pred_boxes.device
    fg_mask = torch.zeros(num_images, num_anchors, dtype=torch.bool, device=device)
    matched_gt = torch.zeros(num_images, num_anchors, dtype=torch.long, device=device)
    matched_iou = torch.zeros(num_images, num_anchors, dtype=torch.float32, device=device)
    ax, ay = anchor_points[:, 0].float(), anchor_points[:, 1].float()
    radius = strides.float() * CENTER_RADIUS_030  # (A,)
    for n in range(num_images):
        gt_idx = gt_mask[n].nonzero()[:, 0]
        if gt_idx.numel() == 0:
            continue
        gt = gt_boxes[n, gt_idx].float()  # (G, 4) cx, cy, w, h
        cx, cy, half_w, half_h = gt[:, 0:1], gt[:, 1:2], gt[:, 2:3] / 2, gt[:, 3:4] / 2
        in_box = (
            torch.stack([ax - (cx - half_w), ay - (cy - half_h), (cx + half_w) - ax, (cy + half_h) - ay], 2)
            .min(-1)
            .values
            > 0
        )  # (G, A)
        in_window = (
            torch.stack([ax - (cx - radius), ay - (cy - radius), (cx + radius) - ax, (cy + radius) - ay], 2)
            .min(-1)
            .values
            > 0
        )
        candidate = in_box.any(0) | in_window.any(0)  # (A,)
        anchors = candidate.nonzero()[:, 0]  # (U,)
        if anchors.numel() == 0:
            continue
        inside_both = in_box[:, anchors] & in_window[:, anchors]  # (G, U)
        ious = bboxes_iou(gt, pred_boxes[n, anchors].float(), xyxy=False)  # (G, U)
        num_gt, num_cand = ious.shape
        p = (cls_logits[n, anchors].float().sigmoid() * obj_logits[n, anchors, None].float().sigmoid()).sqrt()
        onehot = F.one_hot(gt_classes[n, gt_idx].long(), num_classes).float()
        cls_cost = F.binary_cross_entropy(
            p.unsqueeze(0).repeat(num_gt, 1, 1), onehot.unsqueeze(1).repeat(1, num_cand, 1), reduction="none"
        ).sum(-1)
        cost = cls_cost + iou_weight * -torch.log(ious + 1e-8) + PENALTY_030 * (~inside_both)

        dynamic_k = torch.clamp(torch.topk(ious, min(topk, num_cand), dim=1).values.sum(1).int(), min=1)
        matching = torch.zeros_like(cost, dtype=torch.bool)
        for g in range(num_gt):
            matching[g, torch.topk(cost[g], k=int(dynamic_k[g]), largest=False).indices] = True
        takers = matching.sum(0)
        multiple = takers > 1
        if bool(multiple.any()):
            cheapest = cost[:, multiple].argmin(0)
            matching[:, multiple] = False
            matching[cheapest, multiple] = True
        fg = matching.sum(0) > 0
        owner = matching[:, fg].int().argmax(0)
        fg_anchors = anchors[fg]
        fg_mask[n, fg_anchors] = True
        matched_gt[n, fg_anchors] = gt_idx[owner]
        matched_iou[n, fg_anchors] = ious[owner, fg.nonzero()[:, 0]]
    return SimOTAResult(fg_mask, matched_gt, matched_iou, int(fg_mask.sum()))
