"""The inputs the benchmarks and the tests share: training-shaped random batches, and the trained weights the
suites on real photos start from.

`make_inputs`: SimOTA's arguments, 5-40 GTs per image (padded to 120) with log-uniform sizes, predicted
boxes jittered around the GT they sit in, logits in the ranges a trained head produces (the assigner's
tests and benchmark). `random_targets`: a training batch's targets (the training-step benchmarks and
tests), `random_batch` images with them. `WEIGHTS`: official's COCO-trained nano (its layout), next to the
repository in ../shared/weights. Tests import it as `benchmarks.kit.inputs` (pytest puts the repository root
on the path).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

STRIDES = (8, 16, 32)
WEIGHTS = Path(__file__).resolve().parents[3] / "shared" / "weights" / "yolox_nano_coco.pth"


def anchor_grid(size: int, device="cpu"):
    """Anchor centres (A, 2) px and strides (A,) of a size x size input, YOLOX's level/row-major order."""
    points, strides = [], []
    for s in STRIDES:
        n = size // s
        ys, xs = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        grid = torch.stack([xs, ys], dim=-1).reshape(-1, 2).float()
        points.append((grid + 0.5) * s)
        strides.append(torch.full((n * n,), float(s)))
    return torch.cat(points).to(device), torch.cat(strides).to(device)


def make_inputs(
    num_images: int,
    size: int,
    num_classes: int = 80,
    min_gt: int = 5,
    max_gt: int = 40,
    pad_to: int = 120,
    seed: int = 0,
    device="cpu",
) -> dict[str, torch.Tensor]:
    """Random batch in `simota_assign`'s argument layout (see the module docstring for the recipe)."""
    gen = torch.Generator().manual_seed(seed)
    points, strides = anchor_grid(size)
    num_anchors = points.shape[0]
    counts = torch.randint(min_gt, max_gt + 1, (num_images,), generator=gen)
    gt_mask = torch.arange(pad_to)[None] < counts[:, None]  # (N, G)
    wh = torch.exp(
        torch.empty(num_images, pad_to, 2).uniform_(math.log(6), math.log(size * 0.6), generator=gen)
    )
    centre = torch.rand(num_images, pad_to, 2, generator=gen) * size
    gt_boxes = torch.cat([centre, wh], dim=-1) * gt_mask[..., None]
    gt_classes = torch.randint(0, num_classes, (num_images, pad_to), generator=gen) * gt_mask

    # Each anchor "belongs" to the valid GT whose centre is nearest in units of that GT's size.
    near_dist = torch.empty(num_images, num_anchors)
    near = torch.empty(num_images, num_anchors, dtype=torch.long)
    for i in range(num_images):  # per image: (A, G, 2) at a time
        rel = (points[:, None] - centre[i, None]) / wh[i, None]
        dist = rel.abs().amax(-1).masked_fill(~gt_mask[i, None], float("inf"))
        torch.min(dist, dim=-1, out=(near_dist[i], near[i]))
    inside = near_dist < 0.5
    near_wh = torch.gather(wh, 1, near[..., None].expand(-1, -1, 2))
    jitter = torch.randn(num_images, num_anchors, 4, generator=gen)
    pred_xy = points[None] + jitter[..., :2] * strides[None, :, None] * 0.7
    fallback_wh = strides[None, :, None] * torch.exp(1.0 + 0.5 * jitter[..., 2:])
    pred_wh = torch.where(inside[..., None], near_wh * torch.exp(0.3 * jitter[..., 2:]), fallback_wh)
    cls_logits = torch.randn(num_images, num_anchors, num_classes, generator=gen) * 1.5 - 5.0
    near_cls = torch.gather(gt_classes, 1, near)
    boost = inside.float() * (2.0 + 2.0 * torch.rand(num_images, num_anchors, generator=gen))
    cls_logits.scatter_add_(2, near_cls[..., None], boost[..., None])
    obj_logits = torch.randn(num_images, num_anchors, 1, generator=gen) * 2.0 - 4.0 + 4.0 * inside[..., None]
    batch = {
        "pred_boxes": torch.cat([pred_xy, pred_wh], -1),
        "cls_logits": cls_logits,
        "obj_logits": obj_logits,
        "anchor_points": points,
        "strides": strides,
        "gt_boxes": gt_boxes,
        "gt_classes": gt_classes,
        "gt_mask": gt_mask,
    }
    return {k: v.to(device) for k, v in batch.items()}


def random_targets(
    batch: int, size: int, num_classes: int, gen: torch.Generator, max_labels: int = 120
) -> torch.Tensor:
    """(B, max_labels, 5) [cls, cx, cy, w, h] px: 5-40 boxes per image, 8 px to half the image,
    zero-padded."""
    targets = torch.zeros(batch, max_labels, 5)
    for i in range(batch):
        n = int(torch.randint(5, 41, (1,), generator=gen))
        wh = torch.empty(n, 2).uniform_(8, size / 2, generator=gen)
        centre = torch.rand(n, 2, generator=gen) * (size - wh) + wh / 2
        targets[i, :n, 0] = torch.randint(0, num_classes, (n,), generator=gen).float()
        targets[i, :n, 1:3] = centre
        targets[i, :n, 3:5] = wh
    return targets


def random_batch(batch: int, size: int, num_classes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (batch, 3, size, size) 0-255, `random_targets`) on `device`, seeded by `batch`."""
    gen = torch.Generator().manual_seed(batch)
    imgs = (torch.rand(batch, 3, size, size, generator=gen) * 255).to(device)
    return imgs, random_targets(batch, size, num_classes, gen).to(device)
