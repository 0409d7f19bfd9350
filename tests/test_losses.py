"""YOLOX loss: hand-checked values, gradients, DDP normalisation, IoU/GIoU helper."""

import math

import pytest
import torch

from benchmarks.kit.inputs import anchor_grid
from yolox_fast.models import losses
from yolox_fast.models.losses import IOUloss, yolox_loss


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def one_level_case():
    """One 16 px level of 4x4 cells on a 64 px image; one GT of class 1 at (24, 24), 16x12.

    Predictions: 16x16 boxes at the anchor centres, all logits -6. Only anchor 5 (cell (1, 1)) overlaps
    the GT (IoU 0.75; the neighbours only touch it), so dynamic_k = 1 and anchor 5 is the foreground.
    """
    points, strides = anchor_grid(64)
    keep = strides == 16
    strides = strides[keep]
    grids = points[keep] / 16 - 0.5
    raw_reg = torch.cat([torch.full((16, 2), 0.5), torch.zeros(16, 2)], -1)[
        None
    ]  # decodes to the boxes below
    pred_boxes = torch.cat(
        [(raw_reg[..., :2] + grids) * strides[:, None], raw_reg[..., 2:].exp() * strides[:, None]], -1
    )
    labels = torch.zeros(1, 3, 5)
    labels[0, 0] = torch.tensor([1.0, 24.0, 24.0, 16.0, 12.0])
    obj = torch.full((1, 16, 1), -6.0)
    cls = torch.full((1, 16, 2), -6.0)
    return pred_boxes, obj, cls, raw_reg, grids, strides, labels


def test_hand_checked_tiny_case():
    out = yolox_loss(*one_level_case(), use_l1=True)
    iou = 0.75
    assert out["iou_loss"].item() == pytest.approx(5.0 * (1 - iou**2), rel=1e-6)
    assert out["conf_loss"].item() == pytest.approx(softplus(6.0) + 15 * softplus(-6.0), rel=1e-6)
    # class 0 against target 0, class 1 against target IoU = 0.75 (BCE with logits at x = -6)
    assert out["cls_loss"].item() == pytest.approx(softplus(-6.0) + (6.0 * iou + softplus(-6.0)), rel=1e-6)
    # L1 target of cell (1, 1): 24 / 16 - 1 = 0.5, 0.5, log(16 / 16), log(12 / 16)
    assert out["l1_loss"].item() == pytest.approx(abs(math.log(0.75)), rel=1e-5)
    total = out["iou_loss"] + out["conf_loss"] + out["cls_loss"] + out["l1_loss"]
    assert out["total_loss"].item() == pytest.approx(total.item())
    assert out["num_fg"] == 1.0  # one foreground anchor per GT
    assert yolox_loss(*one_level_case(), use_l1=False)["l1_loss"].item() == 0.0


def random_outputs(num_images=2, size=64, num_classes=3, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    points, strides = anchor_grid(size)
    grids = points / strides[:, None] - 0.5
    num_anchors = strides.numel()
    raw = (
        (torch.randn(num_images, num_anchors, 5 + num_classes, generator=gen) * 0.5)
        .to(dtype)
        .requires_grad_()
    )
    labels = torch.zeros(num_images, 6, 5)
    labels[0, :3] = torch.tensor(
        [[0, 20, 20, 16, 20], [2, 40, 30, 30, 12], [1, 50, 50, 8, 8]], dtype=torch.float
    )
    labels[1, :1] = torch.tensor([[1, 32, 32, 40, 40]], dtype=torch.float)
    return raw, grids, strides, labels


def loss_of(raw, grids, strides, labels, **kwargs):
    reg = raw[..., :4].float()
    pred_boxes = torch.cat(
        [(reg[..., :2] + grids) * strides[:, None], reg[..., 2:].exp() * strides[:, None]], -1
    )
    return yolox_loss(pred_boxes, raw[..., 4:5], raw[..., 5:], raw[..., :4], grids, strides, labels, **kwargs)


def test_loss_is_finite_and_gradients_flow():
    raw, grids, strides, labels = random_outputs()
    out = loss_of(raw, grids, strides, labels, use_l1=True)
    for key in ("total_loss", "iou_loss", "conf_loss", "cls_loss", "l1_loss"):
        assert torch.isfinite(out[key]) and out[key] > 0, key
    out["total_loss"].backward()
    grad = raw.grad
    assert torch.isfinite(grad).all()
    for channel in (slice(0, 2), slice(2, 4), slice(4, 5), slice(5, None)):  # xy, wh, obj, cls
        assert grad[..., channel].abs().sum() > 0


def test_bf16_outputs_give_finite_fp32_losses():
    raw, grids, strides, labels = random_outputs(dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loss_of(raw, grids, strides, labels, use_l1=False)
    assert out["total_loss"].dtype == torch.float32 and torch.isfinite(out["total_loss"])
    out["total_loss"].backward()
    assert torch.isfinite(raw.grad.float()).all()


def test_no_ground_truth_only_objectness_loss():
    raw, grids, strides, labels = random_outputs()
    out = loss_of(raw, grids, strides, torch.zeros_like(labels), use_l1=True)
    assert out["iou_loss"].item() == out["cls_loss"].item() == out["l1_loss"].item() == 0.0
    assert out["conf_loss"] > 0 and out["num_fg"] == 0.0
    out["total_loss"].backward()  # normaliser clamps at 1: no division by zero
    assert torch.isfinite(raw.grad).all()


def test_normalised_by_mean_foreground_over_ranks(monkeypatch):
    raw, grids, strides, labels = random_outputs()
    single = loss_of(raw, grids, strides, labels, use_l1=True)
    num_fg = single["num_fg"] * 4  # 4 GTs in the batch
    # Pretend to be one of 2 ranks whose other rank found 3x as many foreground anchors.
    monkeypatch.setattr(losses.dist_utils, "get_world_size", lambda: 2)
    monkeypatch.setattr(losses.dist_utils, "all_reduce_sum", lambda t: t.mul_(4))
    ddp = loss_of(raw, grids, strides, labels, use_l1=True)
    scale = num_fg / (4 * num_fg / 2)
    for key in ("iou_loss", "conf_loss", "cls_loss", "l1_loss", "total_loss"):
        assert ddp[key].item() == pytest.approx(single[key].item() * scale, rel=1e-6), key
    assert ddp["num_fg"] == single["num_fg"]  # per-rank figure


def test_iou_loss_helper():
    pred = torch.tensor([[10.0, 10.0, 10.0, 10.0], [0.0, 0.0, 2.0, 2.0], [5.0, 5.0, 4.0, 4.0]])
    target = torch.tensor([[10.0, 10.0, 10.0, 10.0], [10.0, 0.0, 2.0, 2.0], [6.0, 5.0, 4.0, 4.0]])
    iou = torch.tensor([1.0, 0.0, 12.0 / 20.0])
    torch.testing.assert_close(IOUloss()(pred, target), 1 - iou**2)
    # GIoU of the disjoint pair: 0 - (enclosing 12x2=24 - union 8) / 24
    giou = torch.tensor([1.0, -16.0 / 24.0, 12.0 / 20.0 - (20.0 - 20.0) / 20.0])
    torch.testing.assert_close(IOUloss(loss_type="giou")(pred, target), 1 - giou)
    assert IOUloss(reduction="sum")(pred, target).item() == pytest.approx((1 - iou**2).sum().item())
    with pytest.raises(ValueError):
        IOUloss(loss_type="diou")(pred, target)
