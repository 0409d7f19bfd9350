"""The real fp16 path on a CPU (`--fp16` with `cpu_amp_dtype fp16`): float16 autocast and loss scaling, as
every --fp16 GPU run trains. A skipped overflow step changes nothing, the loss scale survives a resume, and
the assigner, the loss and the head give fp32's results on fp16 values."""

import contextlib
import math
import shutil
import signal

import pytest
import torch
from helpers import run_tool_here
from loguru import logger
from test_simota import RULES, random_case
from test_trainer import EXP_FILE, logged_iterations, tiny_opts, train_args

from yolox_fast.core.stop_signal import TrainingStopped
from yolox_fast.core.trainer import Trainer
from yolox_fast.exp import Exp, get_exp
from yolox_fast.models.losses import yolox_loss
from yolox_fast.models.simota import simota_assign
from yolox_fast.models.simota_reference import simota_assign_reference
from yolox_fast.utils import amp
from yolox_fast.utils.boxes import aligned_iou, bboxes_iou
from yolox_fast.utils.checkpoint import load_checkpoint, save_checkpoint
from yolox_fast.utils.ema import unwrap_model

FP16 = {"cpu_amp_dtype": "fp16"}


class TrainerLog:
    """The messages (DEBUG and up) of the Trainers built with `fp16_trainer(..., log=...)`: each Trainer's
    setup_logger removes every loguru sink, so one is added after each."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._sinks: list[int] = []

    def listen(self) -> None:
        self._sinks.append(logger.add(lambda m: self.lines.append(m.record["message"]), level="DEBUG"))

    def close(self) -> None:
        for sink in self._sinks:
            with contextlib.suppress(ValueError):  # already removed by a later setup_logger
                logger.remove(sink)

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


@pytest.fixture
def trainer_log():
    log = TrainerLog()
    yield log
    log.close()


def fp16_trainer(description, out, *flags, log: TrainerLog | None = None, **overrides) -> Trainer:
    """An in-process Trainer of test_trainer's tiny runs (64 px, batch 4, 6 steps an epoch), `--fp16` on
    the real fp16 path unless `flags` say otherwise; its messages go to `log`."""
    args = train_args(description, out, *(flags or ("--fp16",)), "--logger", "none", **{**FP16, **overrides})
    exp = get_exp(args.exp_file)
    exp.merge(args.opts)
    trainer = Trainer(exp, args)
    if log is not None:
        log.listen()
    return trainer


def started(trainer: Trainer) -> Trainer:
    """`trainer.before_train()` alone, its signal handlers given back (train() would restore them)."""
    try:
        trainer.before_train()
    finally:
        trainer.stop_signal.restore()
    return trainer


# ------------------------------------------------------------------ what --fp16 means on a CPU
def test_cpu_amp_dtype_chooses_what_fp16_means_on_a_cpu(monkeypatch, log_lines):
    monkeypatch.setattr(amp, "_warned_cpu_fp16", False)
    cpu = torch.device("cpu")
    assert amp.amp_dtype(cpu, fp16=True, cpu_dtype="fp16") is torch.float16
    assert amp.amp_dtype(cpu, bf16=True, cpu_dtype="fp16") is torch.bfloat16  # --bf16 stays bf16
    assert amp.amp_dtype(cpu, cpu_dtype="fp16") is None
    assert not [m for m in log_lines if "bfloat16" in m]  # asked for: no fallback warning
    assert amp.amp_dtype(cpu, fp16=True) is torch.bfloat16  # the default stays bf16, said once
    assert [m for m in log_lines if "using bfloat16 autocast instead" in m]
    with pytest.raises(ValueError, match="cpu_dtype must be one of"):
        amp.amp_dtype(cpu, fp16=True, cpu_dtype="fp8")


def test_trainer_builds_the_scaler_from_the_exp(tiny_shapes_coco, tmp_path, monkeypatch):
    monkeypatch.setattr(amp, "_warned_cpu_fp16", False)  # the bf16 trainer's warning is said once a process
    trainer = fp16_trainer(
        tiny_shapes_coco["config"], tmp_path, scaler_init_scale=8, scaler_growth_interval=3
    )
    assert trainer.amp_dtype is torch.float16 and trainer.scaler.is_enabled()
    assert trainer.scaler.get_scale() == 8.0 and trainer.scaler.get_growth_interval() == 3
    bf16 = fp16_trainer(tiny_shapes_coco["config"], tmp_path, cpu_amp_dtype="bf16")
    assert bf16.amp_dtype is torch.bfloat16 and not bf16.scaler.is_enabled()


# ------------------------------------------------------------------ end to end, the command line
@pytest.mark.slow
def test_cli_trains_in_fp16_with_loss_scaling_and_the_scale_grows(tiny_shapes_coco, tmp_path):
    """~200 steps of a 143k-parameter YOLOX (width 0.0625) at 64 px: fp16 convolutions are slow on CPUs."""
    opts = tiny_opts(
        tiny_shapes_coco["config"],
        tmp_path,
        max_epoch=16,
        no_aug_epochs=0,
        eval_interval=100,
        width=0.0625,
        depthwise=False,
        cpu_amp_dtype="fp16",
        scaler_init_scale=1.0,
        scaler_growth_interval=10,
        # YOLOX's lr: at the tiny runs' 0.002 per image (13x) this model's stem weights grow until its fp16
        # activations overflow (seen with the later SimOTA rule: NaN forwards from epoch 2 on)
        basic_lr_per_img=0.01 / 64,
    )
    args = ["-f", EXP_FILE, "-expn", "run", "-b", "2", "--logger", "none", "--fp16", *opts]
    done = run_tool_here("train", *args, cwd=tmp_path)  # as typed, in this process
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    log = (run / "train_log.txt").read_text()
    assert "float16 + loss scaling (scale 1, doubled after 10 steps without overflow)" in log
    assert "using bfloat16 autocast instead" not in log and "non-finite" not in log
    steps = logged_iterations(run / "train_log.txt")
    assert len(steps) >= 150 and all(math.isfinite(loss) for _, _, loss, _ in steps)
    ckpt = load_checkpoint(run / "latest_ckpt.pth")
    scaler = ckpt["scaler"]
    assert scaler["growth_interval"] == 10 and 0 <= scaler["_growth_tracker"] < 10
    # from 1, doubled every 10 clean steps, halved on each overflow: far above 1 after 192 steps
    assert scaler["scale"] >= 2.0**4 and math.log2(scaler["scale"]).is_integer()
    assert ckpt["ema"]["updates"] >= 150


# ------------------------------------------------------------------ a forced overflow
def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Weights, BN statistics (in the state dict), EMA weights and momentum buffers, copied."""
    model = unwrap_model(trainer.model)
    state = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    state.update({f"ema.{k}": v.clone() for k, v in trainer.ema_model.ema.state_dict().items()})
    for i, s in enumerate(trainer.optimizer.state.values()):
        state[f"momentum.{i}"] = s["momentum_buffer"].clone()
    return state


@pytest.mark.slow
def test_an_fp16_overflow_step_changes_nothing_and_halves_the_scale(tiny_shapes_coco, tmp_path, trainer_log):
    bad_step = 2  # 0-based: after two applied steps, so that the momentum buffers exist
    trainer = fp16_trainer(
        tiny_shapes_coco["config"],
        tmp_path,
        log=trainer_log,
        max_epoch=1,
        # small enough not to overflow by itself (at 1024 the first step does), no growth in the run
        scaler_init_scale=32,
        scaler_growth_interval=1000,
    )
    record, streaks = {}, {}
    take_step = trainer.train_one_iter

    def overflow(grad):
        return torch.full_like(grad, float("inf")) if trainer.progress_in_iter == bad_step else grad

    def watched_step():
        progress = trainer.progress_in_iter
        if progress == 0:
            unwrap_model(trainer.model).head.cls_preds[0].weight.register_hook(overflow)
        before = (_state(trainer), trainer.scaler.get_scale(), trainer.ema_model.updates)
        stop = take_step()
        record[progress] = (before, (_state(trainer), trainer.scaler.get_scale(), trainer.ema_model.updates))
        streaks[progress] = trainer.guard.streak
        return stop

    trainer.train_one_iter = watched_step
    trainer.train()

    (state0, scale0, updates0), (state1, scale1, updates1) = record[bad_step]
    assert state0.keys() == state1.keys()
    assert any(k.endswith("num_batches_tracked") for k in state0)  # BN statistics are among them
    changed = [k for k in state0 if not torch.equal(state0[k], state1[k])]
    assert not changed, changed[:5]  # bit-identical: weights, BN mean / var / count, EMA, momentum
    assert updates1 == updates0 == bad_step  # the EMA was not updated
    assert (scale0, scale1) == (32.0, 16.0)  # backoff 0.5
    assert streaks[bad_step] == 0

    (state0, scale0, updates0), (state1, scale1, updates1) = record[bad_step + 1]  # trains normally
    assert scale1 == scale0 == 16.0 and updates1 == updates0 + 1
    count = "model.backbone.backbone.stem.conv.bn.num_batches_tracked"
    assert int(state1[count]) == int(state0[count]) + 1 == bad_step + 1
    for key in (
        "model.head.cls_preds.0.weight",
        "model.head.stems.0.bn.running_mean",
        "ema.head.obj_preds.0.bias",
    ):
        assert not torch.equal(state0[key], state1[key]), key
    # other steps were not skipped: the EMA counts every step but the forced one
    assert trainer.ema_model.updates == trainer.max_iter - 1
    assert not trainer_log.has("non-finite") and not trainer_log.has("not applied")
    assert trainer_log.has("fp16 gradient overflow at epoch 1 iter 3, loss scale 32: step skipped")


# ------------------------------------------------------------------ the scale across a resume
@pytest.mark.slow
def test_the_loss_scale_survives_a_mid_epoch_stop_and_resume(tiny_shapes_coco, tmp_path, trainer_log):
    scaling = {"scaler_init_scale": 8, "scaler_growth_interval": 4, "max_epoch": 1, "eval_interval": 10}
    trainer = fp16_trainer(tiny_shapes_coco["config"], tmp_path, **scaling)
    take_step = trainer.train_one_iter

    def stop_after_three():
        if trainer.progress_in_iter == 2:  # a SIGTERM during the third step: saved after it
            trainer.stop_signal.signum = signal.SIGTERM
        return take_step()

    trainer.train_one_iter = stop_after_three
    with pytest.raises(TrainingStopped):
        trainer.train()
    latest = tmp_path / "run" / "latest_ckpt.pth"
    saved = load_checkpoint(latest)
    assert (saved["start_epoch"], saved["iter"]) == (0, 3)  # mid-epoch: 3 of 6 steps
    # 8, no overflow at so small a scale, three of the four clean steps before a doubling
    assert saved["scaler"] == {
        "scale": 8.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 4,
        "_growth_tracker": 3,
    }
    mid_epoch = tmp_path / "mid_epoch.pth"
    shutil.copy(latest, mid_epoch)

    resumed = fp16_trainer(
        tiny_shapes_coco["config"], tmp_path, "--fp16", "--resume", log=trainer_log, **scaling
    )
    start = resumed.before_train
    at_start = {}

    def before_train():
        start()
        at_start.update(resumed.scaler.state_dict())

    resumed.before_train = before_train
    resumed.train()
    assert at_start == saved["scaler"]
    assert trainer_log.has(f"loss scale 8 continued from {latest}")
    final = load_checkpoint(latest)
    assert final["ema"]["updates"] == 6
    # step 4 completed the four clean steps: doubled to 16, two more steps since
    assert (final["scaler"]["scale"], final["scaler"]["_growth_tracker"]) == (16.0, 2)

    # a shorter growth interval on resume: the count is capped below it, so the scale can still grow
    shorter = started(
        fp16_trainer(
            tiny_shapes_coco["config"],
            tmp_path,
            "--fp16",
            "--resume",
            "-c",
            str(mid_epoch),
            **{**scaling, "scaler_growth_interval": 2},
        )  # fmt: skip
    )
    assert shorter.start_iter == 3
    assert shorter.scaler.state_dict() == {**saved["scaler"], "growth_interval": 2, "_growth_tracker": 1}


def test_a_resume_in_another_precision_says_what_it_does_with_the_scale(
    tiny_shapes_coco, tmp_path, trainer_log
):
    """fp16 checkpoint resumed in fp32: its scale is left unused; a bf16 (scaler-less) checkpoint resumed in
    fp16: the scale starts at scaler_init_scale. Neither is an error."""
    trainer = started(fp16_trainer(tiny_shapes_coco["config"], tmp_path))
    state = trainer.checkpointer.state(start_epoch=0, it=2)
    state["scaler"] = {**state["scaler"], "scale": 32.0, "_growth_tracker": 5}
    fp16_ckpt, bf16_ckpt = tmp_path / "fp16.pth", tmp_path / "bf16.pth"
    save_checkpoint(state, fp16_ckpt)
    save_checkpoint({**state, "scaler": {}}, bf16_ckpt)

    fp32 = started(
        fp16_trainer(tiny_shapes_coco["config"], tmp_path, "--resume", "-c", str(fp16_ckpt), log=trainer_log)
    )
    assert fp32.amp_dtype is None and not fp32.scaler.is_enabled() and fp32.start_iter == 2
    assert trainer_log.has(f"{fp16_ckpt} was trained in fp16: its loss scale is not used by this fp32 run")

    fp16 = started(
        fp16_trainer(
            tiny_shapes_coco["config"],
            tmp_path,
            "--fp16",
            "--resume",
            "-c",
            str(bf16_ckpt),
            log=trainer_log,
            scaler_init_scale=256,
        )
    )
    assert fp16.scaler.get_scale() == 256.0 and fp16.start_iter == 2
    assert trainer_log.has(f"{bf16_ckpt} was not trained in fp16: loss scaling starts at scale 256")

    again = started(
        fp16_trainer(tiny_shapes_coco["config"], tmp_path, "--fp16", "--resume", "-c", str(fp16_ckpt))
    )
    assert again.scaler.state_dict()["scale"] == 32.0 and again.scaler.state_dict()["_growth_tracker"] == 5


# ------------------------------------------------------------------ SimOTA on fp16 values
def as_fp16_and_fp32(batch: dict) -> tuple[dict, dict]:
    """The batch's float tensors rounded to fp16, given once as fp16 and once upcast to fp32 (same values)."""
    half = {k: (v.half() if v.is_floating_point() else v) for k, v in batch.items()}
    return half, {k: (v.float() if v.dtype == torch.float16 else v) for k, v in half.items()}


def assert_same_assignment(a, b):
    assert torch.equal(a.fg_mask, b.fg_mask) and a.num_fg == b.num_fg
    assert torch.equal(a.matched_gt[a.fg_mask], b.matched_gt[b.fg_mask])
    assert a.matched_iou.dtype == b.matched_iou.dtype == torch.float32
    torch.testing.assert_close(a.matched_iou, b.matched_iou, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rule", list(RULES.values()), ids=list(RULES))
def test_simota_on_fp16_inputs_assigns_as_on_their_fp32_values(rule):
    fg = 0
    for seed in range(8):
        half, full = as_fp16_and_fp32(random_case(seed, size=(64, 96, 128)[seed % 3]))
        fp32 = simota_assign(**full, **rule)
        assert_same_assignment(simota_assign(**half, **rule), fp32)
        with torch.autocast("cpu", dtype=torch.float16):
            assert_same_assignment(simota_assign(**half, **rule), fp32)
        fg += fp32.num_fg
    assert fg > 100


def pitfall_case() -> dict:
    """One 64 px image whose values an fp16 computation would get wrong: a 1 px GT with one window anchor and
    ten predictions exactly on it (dynamic_k 10: nine picks outside the window, at +1e5, which is inf in
    fp16), zero-area predictions and GT, boxes of more than 65504 px^2, logits at fp16's extremes (p = 0
    and p = 1: log 0 in the BCE costs)."""
    from benchmarks.kit.inputs import anchor_grid

    points, strides = anchor_grid(64)
    num_anchors = strides.numel()
    gen = torch.Generator().manual_seed(0)
    pred = torch.cat([points, strides[:, None].expand(-1, 2) * 2], 1)[None].clone()  # (1, A, 4)
    cls = torch.randn(1, num_anchors, 3, generator=gen)
    obj = torch.randn(1, num_anchors, 1, generator=gen)
    gt = torch.tensor([[[12.0, 12.0, 1.0, 1.0], [44.0, 44.0, 0.0, 0.0], [48.0, 48.0, 300.0, 300.0]]])
    pred[0, ::7, 2:] = 300.0  # area 90000: inf in fp16 arithmetic
    near = ((points[:64] - 12.0).abs().amax(1) < 20).nonzero()[:, 0]  # stride 8, 4 x 4 anchors
    pred[0, near[:10]] = gt[0, 0]  # IoU 1 with the 1 px GT
    pred[0, near[10:14], 2:] = 0.0  # zero-area predictions
    cls[0, ::5, 0], cls[0, 1::5, 1] = 65504.0, -65504.0  # p = 1 and p = 0 for those classes
    obj[0, 2::9] = -65504.0  # p = 0 at every class
    return {
        "pred_boxes": pred,
        "cls_logits": cls,
        "obj_logits": obj,
        "anchor_points": points,
        "strides": strides,
        "gt_boxes": gt,
        "gt_classes": torch.tensor([[0, 1, 2]]),
        "gt_mask": torch.ones(1, 3, dtype=torch.bool),
    }


@pytest.mark.parametrize("rule", list(RULES.values()), ids=list(RULES))
def test_simota_fp16_pitfalls_penalty_degenerate_boxes_log_of_zero(rule):
    half, full = as_fp16_and_fp32(pitfall_case())
    assert torch.isinf(torch.tensor(1e5, dtype=torch.float16))  # the penalty, were it fp16
    assert torch.isinf(half["pred_boxes"][0, 7, 2:].prod())  # 300 x 300 px, were it fp16
    fp32 = simota_assign(**full, **rule)
    ref = simota_assign_reference(**full, **rule)
    assert torch.equal(fp32.fg_mask, ref.fg_mask) and torch.equal(fp32.matched_gt, ref.matched_gt)
    with torch.autocast("cpu", dtype=torch.float16):
        fp16 = simota_assign(**half, **rule)
    assert_same_assignment(fp16, fp32)
    assert torch.isfinite(fp16.matched_iou).all()
    per_gt = [int((fp16.fg_mask & (fp16.matched_gt == g)).sum()) for g in range(3)]
    # the zero-area GT's window is empty: its one anchor is a pick at + the penalty (1e5 or 1e6, both inf
    # in fp16); with the box prior, so are all but one of the 1 px GT's ten (dynamic_k 10, one window
    # anchor), taken mostly from its exact predictions, which p = 0 (log 0) made dearer in two cases
    assert per_gt[1] == 1 and per_gt[2] > 0
    if rule["box_prior"]:
        assert (
            per_gt[0] == 10 and int((fp16.matched_iou[fp16.fg_mask & (fp16.matched_gt == 0)] == 1).sum()) == 8
        )


def test_box_iou_of_fp16_boxes_is_that_of_their_fp32_values():
    """Areas above 65504 px^2 overflow fp16 (IoU NaN) and 1e-16 rounds to 0 (0 / 0 for zero-area boxes):
    the IoUs compute in fp32 whatever the boxes' dtype."""
    a = torch.tensor([[300.0, 300.0, 400.0, 400.0], [10.0, 10.0, 0.0, 0.0], [5.0, 5.0, 4.0, 4.0]])
    b = torch.tensor([[310.0, 300.0, 400.0, 400.0], [10.0, 10.0, 0.0, 0.0], [5.0, 6.0, 4.0, 2.0]])
    for giou in (False, True):
        expected = aligned_iou(a, b, xyxy=False, giou=giou)
        got = aligned_iou(a.half(), b.half(), xyxy=False, giou=giou)
        assert got.dtype == torch.float32 and torch.equal(got, expected)
    assert aligned_iou(a, b, xyxy=False).tolist()[1] == 0.0  # zero-area boxes: 0, not NaN
    pairwise = bboxes_iou(a.half(), b.half(), xyxy=False)
    assert pairwise.dtype == torch.float32 and torch.equal(pairwise, bboxes_iou(a, b, xyxy=False))
    # the loss's IoU term keeps its gradient through the upcast
    pred = a.half().requires_grad_()
    aligned_iou(pred, b.half(), xyxy=False).sum().backward()
    assert pred.grad.dtype == torch.float16 and torch.isfinite(pred.grad).all()


# ------------------------------------------------------------------ the head and the loss under fp16
def tiny_model(seed: int = 0):
    exp = Exp()
    exp.num_classes, exp.depth, exp.width, exp.depthwise = 6, 0.33, 0.125, False
    torch.manual_seed(seed)
    return exp.get_model()


def test_head_decodes_fp16_offsets_in_fp32():
    """Under fp16 autocast the head's outputs are fp16, but exp() of a wh offset of 12 is 1.6e5 (inf in fp16):
    the boxes handed to the loss are decoded in fp32 and finite."""
    seen = {}

    def recording_loss(pred_boxes, obj_logits, cls_logits, raw_reg, *rest, use_l1):
        seen.update(pred_boxes=pred_boxes, raw_reg=raw_reg)
        return {"total_loss": pred_boxes.sum()}

    model = tiny_model()
    model.head.loss_fn = recording_loss
    for conv in model.head.reg_preds:
        torch.nn.init.zeros_(conv.weight)
        torch.nn.init.constant_(conv.bias, 12.0)
    labels = torch.tensor([[[1, 30, 30, 20, 10]]], dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.float16):
        model(torch.rand(1, 3, 64, 64) * 255, labels)
    assert seen["raw_reg"].dtype == torch.float16  # autocast was on
    assert torch.isinf(seen["raw_reg"][..., 2:].exp()).all()  # what an fp16 decode would give
    boxes = seen["pred_boxes"]
    assert boxes.dtype == torch.float32 and torch.isfinite(boxes).all()
    torch.testing.assert_close(boxes[0, 0, 2:], torch.full((2,), math.exp(12.0) * 8))


def test_loss_of_fp16_outputs_equals_fp32_loss_of_their_values():
    """yolox_loss computes in fp32: fp16 head outputs under fp16 autocast give exactly the loss of their
    fp32 values, and its gradient rounded to fp16."""
    from benchmarks.kit.inputs import anchor_grid

    gen = torch.Generator().manual_seed(0)
    points, strides = anchor_grid(64)
    grids = points / strides[:, None] - 0.5
    raw16 = (torch.randn(2, strides.numel(), 5 + 3, generator=gen) * 0.5).half().requires_grad_()
    raw32 = raw16.detach().float().requires_grad_()
    labels = torch.zeros(2, 4, 5)
    labels[0, :2] = torch.tensor([[0, 20, 20, 16, 20], [2, 40, 30, 30, 12]])
    labels[1, 0] = torch.tensor([1, 32, 32, 40, 40])

    def loss(raw):
        reg = raw[..., :4].float()
        boxes = torch.cat(
            [(reg[..., :2] + grids) * strides[:, None], reg[..., 2:].exp() * strides[:, None]], -1
        )
        return yolox_loss(
            boxes, raw[..., 4:5], raw[..., 5:], raw[..., :4], grids, strides, labels, use_l1=True
        )

    with torch.autocast("cpu", dtype=torch.float16):
        out16 = loss(raw16)
    out32 = loss(raw32)
    for key in ("total_loss", "iou_loss", "conf_loss", "cls_loss", "l1_loss"):
        assert out16[key].dtype == torch.float32 and torch.equal(out16[key], out32[key]), key
    (out16["total_loss"] * 1024).backward()  # scaled, as the GradScaler does
    (out32["total_loss"] * 1024).backward()
    # equal but for fp16 rounding: the two uses of the box offsets add their gradients in fp16
    torch.testing.assert_close(raw16.grad.float(), raw32.grad, rtol=2e-3, atol=1e-3)


def test_model_loss_forward_backward_under_fp16_autocast_is_finite_and_close_to_fp32():
    """The whole model (tiny YOLOX, 64 px) under fp16 autocast: finite losses within a few % of fp32's (its
    activations differ by fp16 rounding, which may move an anchor's assignment) and finite gradients
    everywhere the fp32 ones are non-zero."""
    from benchmarks.kit.inputs import random_targets

    gen = torch.Generator().manual_seed(0)
    imgs = torch.rand(2, 3, 64, 64, generator=gen) * 255
    targets = random_targets(2, 64, 6, gen)
    model = tiny_model()
    model.enable_l1_loss()
    results = {}
    for dtype in (torch.float32, torch.float16):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=dtype is torch.float16):
            out = model(imgs, targets)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=dtype is torch.float16)
        scaler.scale(out["total_loss"]).backward()
        grads = torch.cat([p.grad.flatten() / scaler.get_scale() for p in model.parameters()])
        results[dtype] = (
            {k: float(out[k].detach()) for k in ("total_loss", "iou_loss", "conf_loss", "cls_loss")},
            grads,
        )
    (loss32, grad32), (loss16, grad16) = results[torch.float32], results[torch.float16]
    assert all(math.isfinite(v) and v > 0 for v in loss16.values())
    assert loss16["total_loss"] == pytest.approx(loss32["total_loss"], rel=0.02)
    for key in ("iou_loss", "conf_loss", "cls_loss"):
        assert loss16[key] == pytest.approx(loss32[key], rel=0.1), key
    assert torch.isfinite(grad16).all()
    assert bool((grad16 != 0)[grad32 != 0].float().mean() > 0.99)
