"""One real `Trainer.train_one_iter` on a tiny model and images, checked number by number against values this
test computes on its own: the SGD update (nesterov momentum, weight decay per group), the BatchNorm running
statistics, the EMA, the lr of the step and the fp16 loss scale; and a run resumed mid-epoch from its
checkpoint lands bit for bit on the run that was never interrupted.

The trainer is set up by its own `before_train` (model, optimizer, loader, EMA, guard) on the tiny generated
set; the model is YOLOX-Nano at an eighth of its width on 64 px inputs, so that a step takes well under a
second.
"""

import copy
import math

import pytest
import torch
from helpers import load_tool

from yolox_fast.core.cli import build_exp
from yolox_fast.core.trainer import Trainer
from yolox_fast.utils.ema import unwrap_model

ITERS_PER_EPOCH = 12  # the tiny set's 24 training images in batches of 2


def tiny_trainer(description: str, out, *flags, **overrides) -> Trainer:
    """A Trainer of `-n yolox-nano -b 2` (plus `flags`) on the tiny set at 64 px, width 1/8, after
    `before_train`; `overrides` are exp fields."""
    fields = {
        "dataset": description,
        "output_dir": str(out),
        "num_classes": 6,
        "width": 0.125,
        "input_size": "(64,64)",
        "test_size": "(64,64)",
        "random_size": "none",
        "data_num_workers": 0,
        "seed": 0,
        "max_epoch": 3,
        "warmup_epochs": 0,
        "no_aug_epochs": 1,
        "basic_lr_per_img": 0.01,
        "ema_ramp": 0.5,  # the first update's decay is 0.86: the EMA and the raw weights then differ
        **overrides,
    }
    opts = [str(x) for kv in fields.items() for x in kv]
    args = load_tool("train").parse_args(["-n", "yolox-nano", "-b", "2", "-l", "none", *flags, *opts])
    trainer = Trainer(build_exp(args), args)
    trainer.before_train()
    return trainer


class Recorded:
    """The trainer's batch stream, keeping a copy of each batch it hands out (`change` may alter one, by its
    0-based position, before the trainer sees it)."""

    def __init__(self, batches, change=None) -> None:
        self.batches, self.change, self.seen = batches, change, []

    def __iter__(self):
        return self

    def __next__(self):
        imgs, targets, *rest = next(self.batches)
        if self.change is not None:
            imgs = self.change(len(self.seen), imgs)
        self.seen.append((imgs.clone(), targets.clone()))
        return (imgs, targets, *rest)


def run_one_step(trainer: Trainer, epoch: int, it: int, change=None) -> Recorded:
    """`train_one_iter` at iteration `it` of `epoch` (0-based), as `train_in_epoch` calls it."""
    trainer.epoch, trainer.iter = epoch, it
    trainer.batches = Recorded(trainer.batches, change)
    trainer.train_one_iter()
    return trainer.batches


def states(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    """Copies of what a step changes: raw weights and buffers, EMA weights and buffers."""
    return {
        "raw": {k: v.clone() for k, v in unwrap_model(trainer.model).state_dict().items()},
        "ema": {k: v.clone() for k, v in trainer.ema_model.ema.state_dict().items()},
    }


def expected_cosine_lr(peak: float, min_ratio: float, progress: int, cosine_iters: int) -> float:
    """yoloxwarmcos without warmup, as YOLOX writes it: min + (peak - min) (1 + cos(pi t / T)) / 2."""
    low = peak * min_ratio
    return low + 0.5 * (peak - low) * (1 + math.cos(math.pi * progress / cosine_iters))


def bn_input_hook(store: list):
    return lambda module, inputs, output: store.append(inputs[0].detach().float().clone())


def test_one_training_step_updates_weights_batchnorm_ema_and_lr_exactly(tiny_shapes_coco, tmp_path):
    trainer = tiny_trainer(tiny_shapes_coco["config"], tmp_path)
    exp, model = trainer.exp, unwrap_model(trainer.model)
    assert trainer.max_iter == ITERS_PER_EPOCH and trainer.accumulate == 1
    before = states(trainer)
    twin = copy.deepcopy(model)  # the same weights, to compute the gradient independently
    groups = [
        (g["params"], g.get("weight_decay", 0.0), g["momentum"]) for g in trainer.optimizer.param_groups
    ]

    epoch, it = 0, 3
    recorded = run_one_step(trainer, epoch, it)

    # lr: the cosine at progress 3 of the 2 epochs before the flat no-aug tail (warmup 0)
    peak = exp.basic_lr_per_img * 2
    lr = expected_cosine_lr(peak, exp.min_lr_ratio, epoch * ITERS_PER_EPOCH + it, 2 * ITERS_PER_EPOCH)
    assert lr < 0.99 * peak  # a step that ran at the initial lr would not pass
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([lr] * 3, rel=1e-12)

    # the gradient of the same batch through the twin, and the first BatchNorm's input on the way
    ((imgs, targets),) = recorded.seen
    first_bn = next(m for m in twin.modules() if isinstance(m, torch.nn.BatchNorm2d))
    bn_inputs: list = []
    hook = first_bn.register_forward_hook(bn_input_hook(bn_inputs))
    twin(imgs.float().contiguous(memory_format=torch.channels_last), targets)["total_loss"].backward()
    hook.remove()

    # SGD, nesterov, first step (the momentum buffer starts as the decayed gradient): p -= lr (1 + m) g'
    after = dict(model.named_parameters())
    names = {p: n for n, p in twin.named_parameters()}
    twin_params = dict(twin.named_parameters())
    moved = 0
    for params, decay, momentum in groups:
        for p in params:
            name = next(n for n, q in model.named_parameters() if q is p)
            p0, grad = before["raw"][name], twin_params[name].grad
            expected_delta = -lr * (1 + momentum) * (grad + decay * p0)
            # p1 - p0 in fp32 carries the rounding of p1: a few ulps of |p0| (~1)
            torch.testing.assert_close(after[name].detach() - p0, expected_delta, rtol=1e-3, atol=3e-7)
            moved += int(expected_delta.abs().max() > 0)
    assert moved > 0.9 * len(names) and any(decay > 0 for _, decay, _ in groups)

    # BatchNorm: every running statistic is the twin's, which saw the same batch; the first one also by
    # the formula, from its input: (1 - momentum) old + momentum batch mean / unbiased variance
    raw = model.state_dict()
    for name, value in twin.state_dict().items():
        if "running_" in name or "num_batches_tracked" in name:
            torch.testing.assert_close(raw[name], value, rtol=1e-4, atol=1e-6)
            assert not torch.equal(raw[name], before["raw"][name]), name
    x = bn_inputs[0]
    prefix = next(n for n, m in twin.named_modules() if m is first_bn)
    mean0, var0 = before["raw"][f"{prefix}.running_mean"], before["raw"][f"{prefix}.running_var"]
    bn_now = dict(model.named_modules())[prefix]
    mom = first_bn.momentum
    torch.testing.assert_close(
        bn_now.running_mean, (1 - mom) * mean0 + mom * x.mean((0, 2, 3)), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        bn_now.running_var, (1 - mom) * var0 + mom * x.var((0, 2, 3), unbiased=True), rtol=1e-5, atol=1e-6
    )

    # EMA: the first update, decay 0.9998 (1 - exp(-1 / ramp)); integer buffers copied
    assert trainer.ema_model.updates == 1
    decay = 0.9998 * (1 - math.exp(-1 / exp.ema_ramp))
    ema = trainer.ema_model.ema.state_dict()
    for name, value in raw.items():
        if value.dtype.is_floating_point:
            expected = decay * before["ema"][name] + (1 - decay) * value
            torch.testing.assert_close(ema[name], expected, rtol=1e-5, atol=1e-7)
        else:
            assert torch.equal(ema[name], value), name


def test_fp16_loss_scale_grows_after_a_finite_step_and_halves_after_an_overflow(tiny_shapes_coco, tmp_path):
    """--fp16 with cpu_amp_dtype fp16 (the GPU's path on a CPU): growth interval 1 doubles the scale after
    every applied step; a non-finite gradient halves it, and the step is not applied."""
    trainer = tiny_trainer(
        tiny_shapes_coco["config"],
        tmp_path,
        "--fp16",
        cpu_amp_dtype="fp16",
        scaler_init_scale=4.0,  # far from an fp16 overflow of this fresh model's gradients
        scaler_growth_interval=1,
    )
    assert trainer.scaler.is_enabled() and trainer.scaler.get_scale() == 4.0
    before = states(trainer)["raw"]
    run_one_step(trainer, 0, 0)
    assert trainer.scaler.get_scale() == 8.0
    applied = states(trainer)["raw"]
    assert any(not torch.equal(applied[k], before[k]) for k in before)

    run_one_step(trainer, 0, 1, change=lambda _, imgs: imgs.float().fill_(float("inf")))
    assert trainer.scaler.get_scale() == 4.0
    for name, value in states(trainer)["raw"].items():
        assert torch.equal(value, applied[name]), name


def test_resume_mid_epoch_from_the_checkpoint_is_bit_exact_on_the_real_model(tiny_shapes_coco, tmp_path):
    """Three steps straight, against one step, a checkpoint, a fresh Trainer resumed from it (`--resume`)
    and two more steps: the same raw weights, BatchNorm statistics, EMA and optimizer state, bit for bit.
    Mosaic on (half the samples), so the resumed batch stream must also be the same."""
    opts = {"mosaic_prob": 0.5}
    straight = tiny_trainer(tiny_shapes_coco["config"], tmp_path / "a", **opts)
    for it in range(3):
        run_one_step(straight, 0, it)

    first = tiny_trainer(tiny_shapes_coco["config"], tmp_path / "b", **opts)
    run_one_step(first, 0, 0)
    first.checkpointer.save("latest", start_epoch=0, it=1, epoch=0)
    resumed = tiny_trainer(tiny_shapes_coco["config"], tmp_path / "b", "--resume", **opts)
    assert (resumed.start_epoch, resumed.start_iter) == (0, 1)
    for it in range(1, 3):
        run_one_step(resumed, 0, it)

    want, got = states(straight), states(resumed)
    for part in ("raw", "ema"):
        for name, value in want[part].items():
            assert torch.equal(got[part][name], value), (part, name)
    assert resumed.ema_model.updates == straight.ema_model.updates == 3
    for a, b in zip(straight.optimizer.state.values(), resumed.optimizer.state.values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    assert straight.guard.streak == resumed.guard.streak == 0  # every step was applied
