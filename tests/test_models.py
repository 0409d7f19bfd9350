"""Model zoo: official YOLOX parameter counts and state_dict names, forward shapes, decoding,
the training-mode call into the loss, gradient checkpointing."""

import copy

import pytest
import torch
from torch import nn

from yolox_fast.exp import get_exp
from yolox_fast.models import YOLOPAFPN, YOLOX, Focus, YOLOXHead, get_activation
from yolox_fast.models.network_blocks import space_to_depth

# Official parameter counts (YOLOX model zoo table), in millions, and state_dict sizes of official YOLOX.
OFFICIAL_PARAMS_M = {"nano": 0.91, "tiny": 5.06, "s": 8.97, "m": 25.3, "l": 54.2, "x": 99.1}
OFFICIAL_STATE_KEYS = {"nano": 642, "tiny": 462, "s": 462, "m": 606, "l": 750, "x": 894}


def build(size: str, num_classes: int = 80) -> YOLOX:
    exp = get_exp(exp_name=f"yolox-{size}")
    exp.num_classes = num_classes
    return exp.get_model()


def num_anchors(h: int, w: int) -> int:
    return sum((h // s) * (w // s) for s in (8, 16, 32))


@pytest.mark.parametrize("size", list(OFFICIAL_PARAMS_M))
def test_parameter_count_and_state_size_match_official(size):
    model = build(size)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    assert params == pytest.approx(OFFICIAL_PARAMS_M[size], rel=0.01)
    assert len(model.state_dict()) == OFFICIAL_STATE_KEYS[size]


def test_yolox_s_state_dict_uses_official_names_and_shapes():
    state = build("s").state_dict()
    official = {
        "backbone.backbone.stem.conv.conv.weight": (32, 12, 3, 3),
        "backbone.backbone.stem.conv.bn.running_var": (32,),
        "backbone.backbone.dark2.0.conv.weight": (64, 32, 3, 3),
        "backbone.backbone.dark2.1.m.0.conv2.conv.weight": (32, 32, 3, 3),
        "backbone.backbone.dark3.1.m.2.conv1.bn.num_batches_tracked": (),
        "backbone.backbone.dark5.1.conv1.conv.weight": (256, 512, 1, 1),  # SPP
        "backbone.backbone.dark5.1.conv2.conv.weight": (512, 1024, 1, 1),
        "backbone.backbone.dark5.2.conv3.conv.weight": (512, 512, 1, 1),
        "backbone.lateral_conv0.conv.weight": (256, 512, 1, 1),
        "backbone.C3_p4.conv1.conv.weight": (128, 512, 1, 1),
        "backbone.reduce_conv1.conv.weight": (128, 256, 1, 1),
        "backbone.C3_p3.conv3.bn.bias": (128,),
        "backbone.bu_conv2.conv.weight": (128, 128, 3, 3),
        "backbone.C3_n3.m.0.conv1.conv.weight": (128, 128, 1, 1),
        "backbone.bu_conv1.bn.running_mean": (256,),
        "backbone.C3_n4.conv3.conv.weight": (512, 512, 1, 1),
        "head.stems.0.conv.weight": (128, 128, 1, 1),
        "head.stems.2.conv.weight": (128, 512, 1, 1),
        "head.cls_convs.0.0.conv.weight": (128, 128, 3, 3),
        "head.reg_convs.1.1.bn.weight": (128,),
        "head.cls_preds.0.weight": (80, 128, 1, 1),
        "head.reg_preds.2.weight": (4, 128, 1, 1),
        "head.obj_preds.1.bias": (1,),
    }
    # same order as official YOLOX too: optimizer states follow parameter order
    head_modules = list(dict.fromkeys(k.split(".")[1] for k in state if k.startswith("head.")))
    assert head_modules == ["cls_convs", "reg_convs", "cls_preds", "reg_preds", "obj_preds", "stems"]
    for key, shape in official.items():
        assert key in state, key
        assert tuple(state[key].shape) == shape, key
    # only parameters and BN buffers: no cached grids or other non-official state
    assert all(
        k.rsplit(".", 1)[1] in {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}
        for k in state
    )


def test_nano_uses_depthwise_convs_with_official_names():
    state = build("nano").state_dict()
    assert state["backbone.backbone.dark2.0.dconv.conv.weight"].shape == (16, 1, 3, 3)
    assert state["backbone.backbone.dark2.0.pconv.conv.weight"].shape == (32, 16, 1, 1)
    assert state["head.cls_convs.0.0.dconv.conv.weight"].shape == (64, 1, 3, 3)
    assert state["backbone.bu_conv2.dconv.conv.weight"].shape == (64, 1, 3, 3)
    # the Focus stem and the SPP block stay dense even in nano
    assert state["backbone.backbone.stem.conv.conv.weight"].shape == (16, 12, 3, 3)


@pytest.mark.parametrize(
    "size,hw",
    [
        *[(size, hw) for size in ("nano", "tiny", "s") for hw in ((416, 416), (640, 640))],
        *[pytest.param(size, (416, 416), marks=pytest.mark.slow) for size in ("m", "l", "x")],
    ],
)
def test_eval_output_shape_at_416_and_640(size, hw):
    model = build(size).eval()
    with torch.no_grad():
        out = model(torch.rand(1, 3, *hw) * 255)
    assert out.shape == (1, num_anchors(*hw), 85)
    assert ((out[..., 4:] >= 0) & (out[..., 4:] <= 1)).all()


@pytest.mark.parametrize("size,hw", [("tiny", (128, 96)), ("s", (64, 128))])
def test_small_input_shapes(size, hw):
    model = build(size, num_classes=3).eval()
    with torch.no_grad():
        out = model(torch.rand(2, 3, *hw) * 255)
    assert out.shape == (2, num_anchors(*hw), 8)


def test_eval_decoding_by_hand():
    torch.manual_seed(0)
    head = YOLOXHead(num_classes=2, width=0.125, in_channels=[256, 512, 1024]).eval()
    sizes = [(4, 6), (2, 3), (1, 2)]  # a 32 x 48 px input at strides 8, 16, 32
    xin = [torch.randn(1, c, h, w) for c, (h, w) in zip((32, 64, 128), sizes)]
    with torch.no_grad():
        out = head(xin)
        assert out.shape == (1, 24 + 6 + 2, 7)
        for level, row, col in [(0, 0, 0), (0, 3, 5), (1, 1, 2), (2, 0, 1)]:
            stride = (8, 16, 32)[level]
            x = head.stems[level](xin[level])
            reg = head.reg_preds[level](head.reg_convs[level](x))[0, :, row, col]
            obj = head.obj_preds[level](head.reg_convs[level](x))[0, 0, row, col]
            cls = head.cls_preds[level](head.cls_convs[level](x))[0, :, row, col]
            index = sum(h * w for h, w in sizes[:level]) + row * sizes[level][1] + col
            expected = torch.tensor(
                [
                    (reg[0] + col) * stride,
                    (reg[1] + row) * stride,
                    torch.exp(reg[2]) * stride,
                    torch.exp(reg[3]) * stride,
                    torch.sigmoid(obj),
                    torch.sigmoid(cls[0]),
                    torch.sigmoid(cls[1]),
                ]
            )
            torch.testing.assert_close(out[0, index], expected, rtol=1e-5, atol=1e-5)


def test_decode_in_inference_false_keeps_raw_boxes():
    torch.manual_seed(0)
    model = build("nano", num_classes=3).eval()
    x = torch.rand(1, 3, 64, 64) * 255
    with torch.no_grad():
        decoded = model(x)
        model.head.decode_in_inference = False
        raw = model(x)
    torch.testing.assert_close(raw[..., 4:], decoded[..., 4:])
    # first cell of the stride-8 level: xy = raw_xy * 8, wh = exp(raw_wh) * 8
    torch.testing.assert_close(decoded[0, 0, :2], raw[0, 0, :2] * 8)
    torch.testing.assert_close(decoded[0, 0, 2:4], raw[0, 0, 2:4].exp() * 8)


def test_initialize_biases_sets_prior_probability():
    head = build("nano").head
    for conv in list(head.cls_preds) + list(head.obj_preds):
        torch.testing.assert_close(conv.bias.sigmoid(), torch.full_like(conv.bias, 0.01))


def test_training_forward_hands_decoded_fp32_boxes_to_yolox_loss():
    """The head's side of the loss contract, checked with a stand-in loss_fn."""
    calls = {}

    def fake_loss(pred_boxes, obj_logits, cls_logits, raw_reg, grids, strides, labels, **kwargs):
        calls.update(
            pred_boxes=pred_boxes,
            obj=obj_logits,
            cls=cls_logits,
            raw_reg=raw_reg,
            grids=grids,
            strides=strides,
            labels=labels,
            kwargs=kwargs,
        )
        return {"total_loss": pred_boxes.sum() + obj_logits.sum() + cls_logits.sum()}

    model = build("nano", num_classes=3).train()
    model.head.loss_fn = fake_loss
    model.enable_l1_loss()
    labels = torch.zeros(2, 4, 5)
    labels[0, 0] = torch.tensor([1, 30, 30, 20, 10])
    model(torch.rand(2, 3, 64, 96) * 255, labels)["total_loss"].backward()

    a = num_anchors(64, 96)
    assert calls["pred_boxes"].shape == (2, a, 4) and calls["pred_boxes"].dtype == torch.float32
    assert calls["obj"].shape == (2, a, 1) and calls["cls"].shape == (2, a, 3)
    assert calls["grids"].shape == (a, 2) and calls["strides"].shape == (a,)
    assert calls["labels"] is labels
    assert calls["kwargs"] == {"use_l1": True}  # the SimOTA settings belong to the loss function
    # stride-8 level: 8 x 12 cells, row-major, grid = (x, y)
    assert calls["grids"][13].tolist() == [1.0, 1.0] and calls["strides"][:96].eq(8).all()
    assert calls["grids"][96].tolist() == [0.0, 0.0] and calls["strides"][96] == 16
    raw = calls["raw_reg"].float()
    expected_xy = (raw[..., :2] + calls["grids"]) * calls["strides"][:, None]
    torch.testing.assert_close(calls["pred_boxes"][..., :2], expected_xy)
    torch.testing.assert_close(calls["pred_boxes"][..., 2:], raw[..., 2:].exp() * calls["strides"][:, None])
    assert model.head.cls_preds[0].weight.grad is not None


def test_the_exps_simota_settings_are_the_heads_loss_function():
    from yolox_fast.exp import Exp
    from yolox_fast.models.losses import YOLOXLoss

    exp = Exp()
    exp.depth, exp.width, exp.num_classes = 0.33, 0.25, 3
    exp.merge(["simota_box_prior", "false", "simota_center_radius", "1.5", "simota_topk", "7"])
    exp.simota_max_bytes = 2**20
    loss = exp.get_model().head.loss_fn
    assert loss == YOLOXLoss(center_radius=1.5, box_prior=False, topk=7, max_bytes=2**20)


def test_training_forward_without_labels_is_an_error():
    model = build("nano").train()
    with pytest.raises(ValueError, match="labels"):
        model(torch.rand(1, 3, 64, 64))


def test_training_step_gives_finite_losses_and_equals_its_grad_checkpointed_twin():
    torch.manual_seed(0)
    plain, ckpt = build("nano", num_classes=3).train(), build("nano", num_classes=3).train()
    ckpt.load_state_dict(plain.state_dict())
    ckpt.set_grad_checkpointing(True)
    for model in (plain, ckpt):
        model.head.use_l1 = True
    imgs = torch.rand(2, 3, 64, 64) * 255
    labels = torch.zeros(2, 2, 5)
    labels[0, 0] = torch.tensor([1, 30, 30, 24, 18])
    labels[1, 0] = torch.tensor([2, 40, 20, 16, 30])
    loss_plain, loss_ckpt = plain(imgs, labels), ckpt(imgs, labels)
    assert {"total_loss", "iou_loss", "conf_loss", "cls_loss", "l1_loss", "num_fg"} <= set(loss_plain)
    assert torch.isfinite(loss_plain["total_loss"]) and float(loss_plain["num_fg"]) > 0
    loss_plain["total_loss"].backward()
    loss_ckpt["total_loss"].backward()
    stem_grad = plain.backbone.backbone.stem.conv.conv.weight.grad
    assert torch.isfinite(stem_grad).all() and stem_grad.abs().sum() > 0
    for key in ("total_loss", "iou_loss", "conf_loss", "cls_loss", "l1_loss"):
        torch.testing.assert_close(loss_ckpt[key], loss_plain[key], msg=key)
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_grad_checkpointing_gives_same_outputs_gradients_and_bn_stats():
    torch.manual_seed(0)
    ref = YOLOPAFPN(0.33, 0.125, depthwise=False).train()
    ckpt = YOLOPAFPN(0.33, 0.125, depthwise=False).train()
    ckpt.load_state_dict(ref.state_dict())
    ckpt.set_grad_checkpointing(True)
    x = torch.rand(2, 3, 64, 64) * 255
    runs = {"dark3": 0, "C3_n4": 0}
    ckpt.backbone.dark3.register_forward_pre_hook(lambda *_: runs.__setitem__("dark3", runs["dark3"] + 1))
    ckpt.C3_n4.register_forward_pre_hook(lambda *_: runs.__setitem__("C3_n4", runs["C3_n4"] + 1))

    outs_ref, outs_ckpt = ref(x), ckpt(x)
    weights = [torch.randn_like(o) for o in outs_ref]
    sum((o * w).sum() for o, w in zip(outs_ref, weights)).backward()
    sum((o * w).sum() for o, w in zip(outs_ckpt, weights)).backward()
    assert runs == {"dark3": 2, "C3_n4": 2}  # forward, then recomputed in backward

    for a, b in zip(outs_ref, outs_ckpt):
        torch.testing.assert_close(a, b)
    for (name, p), q in zip(ref.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    # the recomputation in backward must not update running statistics a second time
    for (name, a), b in zip(ref.state_dict().items(), ckpt.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_yolox_set_grad_checkpointing_reaches_backbone_and_neck():
    model = build("nano")
    model.set_grad_checkpointing(True)
    assert model.backbone.grad_checkpointing and model.backbone.backbone.grad_checkpointing
    model.set_grad_checkpointing(False)
    assert not model.backbone.grad_checkpointing and not model.backbone.backbone.grad_checkpointing


def test_space_to_depth_stacks_pixel_phases_in_yolox_order():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    out = space_to_depth(x)
    expected = [x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]]
    for c, phase in enumerate(expected):
        torch.testing.assert_close(out[:, c : c + 1], phase)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("ksize", [1, 3])
def test_focus_equals_its_conv_on_the_space_to_depth_image_with_the_same_gradients(layout, ksize):
    # the stem runs as one strided conv of the image: outputs and every gradient equal the layer-by-layer
    # definition (YOLOX's: phases stacked, then the BaseConv), to float rounding
    torch.manual_seed(0)
    focus = Focus(3, 8, ksize=ksize).train().to(memory_format=layout)
    twin = copy.deepcopy(focus)
    x = (torch.rand(2, 3, 32, 48) * 255).contiguous(memory_format=layout)
    out, expected = focus(x), twin.conv(space_to_depth(x))
    assert out.is_contiguous(memory_format=layout) and out.shape == (2, 8, 16, 24)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-3)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for (name, p), q in zip(focus.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-2, msg=name)
    torch.testing.assert_close(focus.conv.bn.running_mean, twin.conv.bn.running_mean)


def test_unknown_activation_names_the_choices():
    assert isinstance(get_activation("lrelu"), nn.LeakyReLU)
    with pytest.raises(ValueError, match="silu"):
        get_activation("gelu")


def test_silu_is_out_of_place_under_autograd_and_in_place_without():
    act = get_activation("silu")
    leaf = torch.randn(2, 4, 5, 5, requires_grad=True)
    twin = leaf.detach().clone().requires_grad_()
    x = leaf * 1.0  # a non-leaf input, as a BatchNorm output is
    y = act(x)
    # out of place: autograd keeps x itself for the backward instead of a copy of it
    assert y.data_ptr() != x.data_ptr() and torch.equal(x, leaf)
    expected = nn.SiLU()(twin * 1.0)
    assert torch.equal(y, expected)
    grad = torch.randn_like(y)
    y.backward(grad)
    expected.backward(grad)
    assert torch.equal(leaf.grad, twin.grad)
    with torch.no_grad():
        x = torch.randn(2, 4, 5, 5)
        out = act(x)
    assert out.data_ptr() == x.data_ptr()  # in place where nothing is recorded: no allocation
