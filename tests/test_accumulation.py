"""Gradient accumulation to a nominal batch (core/accumulation.py, Trainer._accumulate_gradients): 4 batches
of 2 give the gradient of one batch of 8, the non-finite guard skips the whole step, and the command line's
`-b 2 nominal_batch_size 8` runs optimizer steps of 8 images with lr, iterations and EMA counted in them."""

import re

import pytest
import torch
from helpers import load_tool, run_tool_here
from test_train_step import run_one_step, states, tiny_trainer
from test_trainer import tiny_opts, train_cmd

from benchmarks.kit.inputs import random_targets
from yolox_fast.core.accumulation import accumulation_steps
from yolox_fast.core.nonfinite import NonFiniteGuard
from yolox_fast.core.trainer import Trainer
from yolox_fast.exp import get_exp
from yolox_fast.utils.checkpoint import load_checkpoint


def test_accumulation_steps_follow_the_nominal_batch():
    assert accumulation_steps(None, 16) == 1
    assert accumulation_steps(64, 16) == 4
    assert accumulation_steps(64, 64) == 1
    assert accumulation_steps(64, 128) == 1  # the batch is already bigger: lr follows the batch itself
    with pytest.raises(ValueError, match="not a multiple of -b 24"):
        accumulation_steps(64, 24)


def _step_trainer(tmp_path, accumulate: int, batches, dtype, scaler=None) -> Trainer:
    """A Trainer holding YOLOX-nano with its BatchNorm in eval mode (each image's loss then depends on that
    image alone), fed `batches` of (images, targets): only what `_accumulate_gradients` reads."""
    args = load_tool("train").parse_args(["-n", "yolox-nano", "-l", "none", "output_dir", str(tmp_path)])
    exp = get_exp(args.exp_file, args.name)
    trainer = Trainer(exp, args)
    torch.manual_seed(0)
    model = exp.get_model().to(dtype)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eval()
    trainer.model, trainer.memory_format, trainer.accumulate = model, torch.contiguous_format, accumulate
    trainer.input_size = tuple(batches[0][0].shape[2:])
    trainer.batches = iter([(imgs, targets) for imgs, targets in batches])
    if scaler is not None:
        trainer.scaler = scaler
    params = [p for p in model.parameters() if p.requires_grad]
    trainer.guard = NonFiniteGuard(model, params, trainer.scaler, False, str(tmp_path))
    return trainer


def _batch(dtype):
    gen = torch.Generator().manual_seed(0)
    imgs = (torch.rand(8, 3, 64, 64, generator=gen) * 255).to(dtype)
    targets = random_targets(8, 64, 80, gen).to(dtype)
    targets[:, 6:] = 0  # at most 6 boxes an image, so that the foreground counts differ between images
    return imgs, targets


def test_four_accumulated_batches_give_the_gradient_of_one_batch_of_all_their_images(tmp_path):
    """In float32 (the trainer feeds float32 images), equal to its rounding: the batches of 2 and of 8 run
    other convolution kernels, which sum in another order."""
    dtype, tolerance = torch.float32, 1e-5
    imgs, targets = _batch(dtype)
    results = {}
    for accumulate in (1, 4):
        size = 8 // accumulate
        batches = [(imgs[i : i + size], targets[i : i + size]) for i in range(0, 8, size)]
        trainer = _step_trainer(tmp_path, accumulate, batches, dtype)
        losses, _ = trainer._accumulate_gradients()
        grads = torch.cat([p.grad.flatten() for p in trainer.guard.params])
        results[accumulate] = (losses, grads, [float(trainer.model(i, t)["fg_count"]) for i, t in batches])
    (big, g_big, _), (acc, g_acc, counts) = results[1], results[4]
    assert len(set(counts)) > 1  # the batches differ in foreground count: a plain mean would be wrong
    assert ((g_acc - g_big).norm() / g_big.norm()).item() < tolerance
    for key in ("total_loss", "iou_loss", "conf_loss", "cls_loss"):
        assert float(acc[key]) == pytest.approx(float(big[key]), rel=tolerance)

    # what the weighting is for: the plain mean of the 4 batches' gradients (each normalised by its own
    # foreground count, as Ultralytics' per-image losses would allow) is measurably another gradient
    weights = torch.tensor(counts, dtype=torch.float64)
    assert (weights / weights.sum() - 0.25).abs().max() > 0.01


def test_a_non_finite_batch_skips_the_whole_accumulated_step(tmp_path):
    imgs, targets = _batch(torch.float32)
    bad = imgs.clone()
    bad[6:] = float("nan")  # the last of 4 batches of 2
    batches = [(bad[i : i + 2], targets[i : i + 2]) for i in range(0, 8, 2)]
    trainer = _step_trainer(tmp_path, 4, batches, torch.float32)
    losses, _ = trainer._accumulate_gradients()
    bad_loss, bad_grads, _ = trainer.guard.check_step(losses["total_loss"], False)
    assert bad_loss or bad_grads  # one check for the whole step: it is skipped, not applied in part


def test_the_loss_scaler_unscales_once_per_accumulated_step(tmp_path):
    """fp16's GradScaler (enabled on CPU here to run its arithmetic): 4 scaled batches, one unscale_, the
    gradient of the unscaled big batch."""
    imgs, targets = _batch(torch.float32)
    plain = _step_trainer(tmp_path, 1, [(imgs, targets)], torch.float32)
    plain._accumulate_gradients()
    expected = torch.cat([p.grad.flatten() for p in plain.guard.params])
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    batches = [(imgs[i : i + 2], targets[i : i + 2]) for i in range(0, 8, 2)]
    scaled = _step_trainer(tmp_path, 4, batches, torch.float32, scaler=scaler)
    scaled.optimizer = torch.optim.SGD(scaled.guard.params, lr=0.0)
    scaled._accumulate_gradients()
    scaler.unscale_(scaled.optimizer)
    got = torch.cat([p.grad.flatten() for p in scaled.guard.params])
    assert ((got - expected).norm() / expected.norm()).item() < 1e-5


def test_a_non_finite_batch_leaves_weights_batchnorm_and_ema_of_the_accumulated_step_unchanged(
    tiny_shapes_coco, tmp_path
):
    """`-b 2 nominal_batch_size 4`: two batches per step; the second is NaN. Nothing of the step stays: the
    weights, the BatchNorm statistics the first (finite) batch folded in, the EMA and its update count, the
    optimizer's momentum."""
    trainer = tiny_trainer(tiny_shapes_coco["config"], tmp_path, nominal_batch_size=4)
    assert trainer.accumulate == 2
    run_one_step(trainer, 0, 0)  # a good step first: momentum buffers and an EMA update exist
    assert trainer.guard.streak == 0
    before = states(trainer)
    momentum = [s["momentum_buffer"].clone() for s in trainer.optimizer.state.values()]
    updates = trainer.ema_model.updates

    recorded = run_one_step(
        trainer, 0, 1, change=lambda i, imgs: imgs.float().fill_(float("nan")) if i else imgs
    )
    assert len(recorded.seen) == 2 and recorded.seen[0][0].isfinite().all()
    after = states(trainer)
    for part in ("raw", "ema"):
        for name, value in after[part].items():
            assert torch.equal(value, before[part][name]), (part, name)
    assert trainer.ema_model.updates == updates
    for old, state in zip(momentum, trainer.optimizer.state.values()):
        assert torch.equal(state["momentum_buffer"], old)
    assert trainer.guard.streak == 1


@pytest.mark.slow
def test_nominal_batch_from_the_command_line(tiny_shapes_coco, tmp_path):
    """`-b 2 nominal_batch_size 8` on 24 images: 12 batches an epoch, 3 optimizer steps of 8 images; lr is
    basic_lr_per_img * 8; the EMA counts the 3 steps. With a disk cache, whose building shows its progress."""
    opts = tiny_opts(
        tiny_shapes_coco["config"], tmp_path, max_epoch=1, no_aug_epochs=0, nominal_batch_size=8
    ) + ["cache_dir", str(tmp_path)]
    out = run_tool_here("train", *train_cmd(opts, "--cache", "disk")[2:])  # as typed, in this process
    assert out.returncode == 0, out.stderr[-3000:]
    log = (tmp_path / "run" / "train_log.txt").read_text()
    assert "4 batches accumulated per optimizer step = 8 images" in log
    assert re.search(r"\blr\s+0\.016 \(yoloxwarmcos\)", log)  # basic_lr_per_img 0.002 * 8
    assert re.findall(r"epoch: 1/1, iter: (\d+)/(\d+)", log) == [("1", "3"), ("2", "3"), ("3", "3")]
    assert load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")["ema"]["updates"] == 3
    # progress bars as whole lines, no carriage returns in the log file
    assert re.search(r"building cache .* \[#+\] 24/24", log) and re.search(r"eval \[#+\] 8/8", log)
    assert "\r" not in log
