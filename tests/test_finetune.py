"""Fine-tuning from -c weights: BatchNorm folded into the convolutions is refitted, the class layer starts at
the prior, `freeze` keeps parts fixed, `patience` stops early (and survives a resume)."""

import copy
import re
from pathlib import Path

import pytest
import torch
from helpers import run_tool_in_process
from torch import nn

from yolox_fast.exp import Exp
from yolox_fast.models.folded_bn import has_folded_bn, refit_folded_bn
from yolox_fast.models.network_blocks import BaseConv
from yolox_fast.utils.checkpoint import load_checkpoint, load_model_weights, save_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXP_FILE = str(REPO / "exps" / "example" / "shapes_nano.py")


def nano(num_classes: int = 80) -> nn.Module:
    exp = Exp()
    exp.depth, exp.width, exp.depthwise, exp.num_classes = 0.33, 0.25, True, num_classes
    torch.manual_seed(0)
    return exp.get_model()


def images(n: int = 8, size: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g) * 255


@torch.no_grad()
def trained_like(model: nn.Module) -> nn.Module:
    """Give every BatchNorm the statistics and affine weights of a trained model."""
    g = torch.Generator().manual_seed(1)
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.weight.copy_(0.5 + torch.rand(bn.weight.shape, generator=g))
        bn.bias.copy_(torch.randn(bn.bias.shape, generator=g) * 0.2)
    model.train()
    momentum = [(bn, bn.momentum) for bn in model.modules() if isinstance(bn, nn.BatchNorm2d)]
    for bn, _ in momentum:
        bn.momentum = None  # a cumulative average over the batches below
    for i in range(4):
        model.backbone(images(seed=10 + i))
    for bn, value in momentum:
        bn.momentum = value
    return model.eval()


@torch.no_grad()
def fold(model: nn.Module) -> nn.Module:
    """What an ONNX export rebuilt into the model does: each BatchNorm's scale and shift go into its conv
    weight and BN bias, and the BN is left with identity statistics."""
    for block in (m for m in model.modules() if isinstance(m, BaseConv)):
        bn = block.bn
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        block.conv.weight.mul_(scale[:, None, None, None])
        bn.bias.copy_(bn.bias - scale * bn.running_mean)
        bn.weight.fill_(1.0)
        bn.running_mean.zero_()
        bn.running_var.fill_(1 - bn.eps)
    return model


def save_folded_coco_nano(path) -> None:
    """A checkpoint file like the shared COCO weights: an 80-class nano with trained-like statistics, its
    BatchNorm folded into the convolutions."""
    save_checkpoint({"model": fold(trained_like(nano(80))).state_dict()}, str(path))


def backbone_gap(model: nn.Module, x: torch.Tensor) -> float:
    """Relative distance of the backbone's train-mode (batch statistics) outputs from its eval-mode ones
    (on a copy: a train-mode forward moves the running statistics)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.eval()
        ref = model.backbone(x)
        model.train()
        out = model.backbone(x)
    model.eval()
    return max(float((a - b).norm() / b.norm()) for a, b in zip(out, ref))


def assert_same_function(model: nn.Module, expected: tuple[torch.Tensor, ...], x: torch.Tensor) -> None:
    with torch.no_grad():
        for out, ref in zip(model.eval().backbone(x), expected):
            assert float((out - ref).norm() / ref.norm()) < 1e-4


def test_refit_keeps_the_function_and_brings_train_mode_back_to_it():
    model = trained_like(nano())
    x = images(8, seed=3)
    with torch.no_grad():
        expected = model.backbone(x)
    assert not has_folded_bn(model)
    folded = fold(trained_like(nano()))
    assert_same_function(folded, expected, x)  # folding keeps the function
    assert has_folded_bn(folded)
    assert backbone_gap(folded, x) > 0.3  # train mode computes another function
    seen = refit_folded_bn(folded, [x])
    assert seen == 8 and not has_folded_bn(folded)
    assert_same_function(folded, expected, x)  # refitting keeps it too
    # statistics measured on x: in train mode every layer normalises x by them, so it computes the same
    assert backbone_gap(folded, x) < 1e-3


def test_the_class_layer_of_another_class_count_starts_at_the_prior():
    source = nano(80)
    target = nano(3)
    skipped = load_model_weights(target, source.state_dict())
    assert skipped and all(k.startswith("head.cls_preds") for k in skipped)
    prior = -torch.log(torch.tensor((1 - 0.01) / 0.01))
    for conv in target.head.cls_preds:
        torch.testing.assert_close(conv.bias.detach(), torch.full_like(conv.bias, float(prior)))
    state = target.state_dict()
    for key, value in source.state_dict().items():
        if key not in skipped:
            torch.testing.assert_close(state[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("part, frozen", [("backbone", "backbone.backbone"), ("backbone+neck", "backbone")])
def test_freeze_keeps_the_part_and_its_batchnorm_fixed(part, frozen):
    model = nano(3)
    total = sum(p.numel() for p in model.parameters())
    fixed = model.get_submodule(frozen)
    trainable = model.freeze(part)
    assert trainable == total - sum(p.numel() for p in fixed.parameters())
    model.train()
    assert not any(m.training for m in fixed.modules())
    assert model.head.training
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    targets = torch.tensor([[[0, 32.0, 32.0, 20.0, 20.0], [1, 16.0, 16.0, 10.0, 12.0]]]).repeat(2, 1, 1)
    for _ in range(2):
        loss = model(images(2), targets)["total_loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = model.state_dict()
    prefix = frozen + "."
    for key in before:
        same = torch.equal(before[key], after[key])
        if key.startswith(prefix):
            assert same, f"{key} changed although frozen"
    assert not torch.equal(before["head.cls_preds.0.weight"], after["head.cls_preds.0.weight"])
    with pytest.raises(ValueError, match="freeze must be one of"):
        model.freeze("head")


def _train(*args: str, cwd: Path) -> str:
    """`python tools/train.py args...` as typed, in this process; asserts exit 0."""
    return run_tool_in_process("train", *args, cwd=cwd)


@pytest.mark.slow
def test_finetune_from_folded_weights_frozen_with_early_stopping_and_resume(tiny_shapes_coco, tmp_path):
    """As typed: -c a folded COCO-style checkpoint (80 classes) onto the 6-class set, the backbone frozen,
    patience 1, with lr 0 so that no evaluation improves on the first: the run stops after its second; a
    resume with a larger patience goes on counting from there."""
    ckpt = tmp_path / "folded_coco_nano.pth"
    save_folded_coco_nano(ckpt)
    fields = {
        "dataset": tiny_shapes_coco["config"],
        "output_dir": tmp_path / "out",
        "input_size": "(64,64)",
        "test_size": "(64,64)",
        "random_size": "(2,2)",
        "data_num_workers": 0,
        "max_epoch": 6,
        "no_aug_epochs": 0,
        "warmup_epochs": 0,
        "eval_interval": 1,
        "basic_lr_per_img": 0.0,
        "seed": 0,
        "save_eval_report": "false",
        "freeze": "backbone",
        "patience": 1,
    }
    opts = [str(x) for kv in fields.items() for x in kv]
    base = ["-f", EXP_FILE, "-expn", "ft", "-b", "4", "-l", "none"]
    out = _train(*base, "-c", str(ckpt), *opts, cwd=tmp_path)
    assert "carry identity statistics" in out and "re-estimated them on 24 training images" in out
    trainable = re.search(r"trainable parameters: ([\d,]+) of ([\d,]+) \(freeze: backbone\)", out)
    assert trainable and int(trainable[1].replace(",", "")) < int(trainable[2].replace(",", ""))
    assert "early stop after epoch 2" in out and "start epoch 3/6" not in out
    run = tmp_path / "out" / "ft"
    assert load_checkpoint(run / "best_ckpt.pth")["start_epoch"] == 1
    latest = load_checkpoint(run / "latest_ckpt.pth")
    assert latest["start_epoch"] == 2 and latest["evals_since_best"] == 1 and latest["best_epoch"] == 1

    resumed = _train(*base, "--resume", *opts[:-2], "patience", "3", cwd=tmp_path)
    assert "start epoch 3/6" in resumed and "early stop after epoch 4" in resumed
    assert "re-estimated" not in resumed  # a resume continues the weights as they are
