"""Box utilities: conversions, IoU, postprocess against hand-computed detections, BN folding."""

import pytest
import torch
from torch import nn

from yolox_fast.exp import get_exp
from yolox_fast.models.network_blocks import fuse_model
from yolox_fast.utils.boxes import aligned_iou, bboxes_iou, cxcywh2xyxy, postprocess


def xyxy2cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    return torch.cat([(boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]], dim=-1)


def test_cxcywh2xyxy_on_a_known_box_keeps_leading_dims_and_input():
    boxes = torch.tensor([[[30.0, 50.0, 40.0, 60.0]]]).expand(2, 3, 4).clone()
    before = boxes.clone()
    assert cxcywh2xyxy(boxes).tolist() == [[[10.0, 20.0, 50.0, 80.0]] * 3] * 2
    assert torch.equal(boxes, before)


def test_bboxes_iou_pairwise_by_hand():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 2.0, 2.0]])
    b = torch.tensor([[5.0, 5.0, 15.0, 15.0], [0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    expected = torch.tensor([[25 / 175, 1.0, 0.0], [0.0, 4 / 100, 0.0]])
    torch.testing.assert_close(bboxes_iou(a, b), expected)
    torch.testing.assert_close(bboxes_iou(xyxy2cxcywh(a), xyxy2cxcywh(b), xyxy=False), expected)


def test_aligned_iou_is_the_diagonal_of_pairwise():
    torch.manual_seed(0)
    xy = torch.rand(6, 2) * 50
    a = torch.cat([xy, xy + torch.rand(6, 2) * 30 + 1], 1)
    b = a + torch.randn(6, 4) * 3
    b[:, 2:] = torch.max(b[:, 2:], b[:, :2] + 1)
    torch.testing.assert_close(aligned_iou(a, b), bboxes_iou(a, b).diagonal())
    torch.testing.assert_close(aligned_iou(xyxy2cxcywh(a), xyxy2cxcywh(b), xyxy=False), aligned_iou(a, b))


def test_iou_of_zero_area_boxes_is_zero_not_nan():
    empty = torch.zeros(2, 4)
    assert bboxes_iou(empty, empty).eq(0).all()
    assert aligned_iou(empty, empty).eq(0).all()


def make_prediction():
    """Image 0: A (class 0, score .72), B overlapping A (class 0, .6), C on B's box but class 1 (.63),
    D below threshold (.15). Image 1: nothing above threshold."""
    rows = [
        # cx, cy, w, h, obj, cls0, cls1
        [50, 50, 20, 20, 0.9, 0.8, 0.1],  # A
        [52, 50, 20, 20, 0.8, 0.75, 0.2],  # B: IoU with A = 360 / 440
        [52, 50, 20, 20, 0.9, 0.1, 0.7],  # C
        [10, 10, 4, 4, 0.5, 0.3, 0.2],  # D
    ]
    pred = torch.zeros(2, 4, 7)
    pred[0] = torch.tensor(rows)
    pred[1, :, 4] = 0.1
    pred[1, :, 5:] = 0.5
    return pred


def test_postprocess_class_aware_matches_hand_computation():
    pred = make_prediction()
    before = pred.clone()
    out = postprocess(pred, num_classes=2, conf_thre=0.3, nms_thre=0.45)
    expected = torch.tensor(
        [
            [40, 40, 60, 60, 0.9, 0.8, 0],  # A
            [42, 40, 62, 60, 0.9, 0.7, 1],  # C survives: other class
        ]
    )
    torch.testing.assert_close(out[0], expected)
    assert out[1] is None
    assert torch.equal(pred, before)


def test_postprocess_class_agnostic_suppresses_across_classes():
    out = postprocess(make_prediction(), num_classes=2, conf_thre=0.3, nms_thre=0.45, class_agnostic=True)
    torch.testing.assert_close(out[0], torch.tensor([[40, 40, 60, 60, 0.9, 0.8, 0]]))


def test_postprocess_keeps_overlaps_below_nms_threshold():
    out = postprocess(make_prediction(), num_classes=2, conf_thre=0.3, nms_thre=0.9)
    assert out[0][:, 6].tolist() == [0, 1, 0]  # A (.72), C (.63), B (.6): sorted by score


def test_fuse_model_gives_equal_outputs():
    torch.manual_seed(0)
    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = 5
    model = exp.get_model()
    for m in model.modules():  # non-trivial statistics, as after training
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.2, 0.2)
    model.eval()
    x = torch.rand(1, 3, 64, 96) * 255
    with torch.no_grad():
        ref = model(x)
        fused = fuse_model(model)(x)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert model.backbone.backbone.stem.conv.conv.bias is not None
    torch.testing.assert_close(fused, ref, atol=1e-4, rtol=1e-4)


def test_postprocess_of_an_image_without_candidates_is_none():
    assert postprocess(torch.zeros(1, 0, 7), num_classes=2) == [None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bboxes_iou_keeps_dtype(dtype):
    a = torch.tensor([[0, 0, 4, 4]], dtype=dtype)
    assert bboxes_iou(a, a).dtype == dtype and bboxes_iou(a, a).item() == 1.0
