"""Trainer end to end on a tiny synthetic set: it learns, evaluates, checkpoints, resumes exactly, and
stops safely on signals, non-finite losses and broken checkpoints."""

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from helpers import load_tool, run_tool_here

from yolox_fast.core.trainer import Trainer, run_training
from yolox_fast.exp import get_exp
from yolox_fast.utils import amp
from yolox_fast.utils.checkpoint import load_checkpoint, resume_checkpoint_path, save_checkpoint
from yolox_fast.utils.lr_scheduler import LRScheduler

REPO = Path(__file__).resolve().parents[1]
EXP_FILE = str(REPO / "exps" / "example" / "shapes_nano.py")
LOG_LINE = re.compile(
    r"epoch: (\d+)/(\d+), iter: (\d+)/(\d+), .*total_loss: ([\d.naninf]+),"
    r".*l1_loss: ([\d.naninf]+),.* lr: ([\d.e+-]+), size"
)


@contextmanager
def running(cmd, **kwargs):
    """Popen in its own session; whatever is left of it (workers included) is killed on the way out."""
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def train_cmd(opts: list, *flags) -> list:
    """`python tools/train.py` on the shapes exp into run/, batch 2, no logger, then `flags` and `opts`."""
    train = str(REPO / "tools" / "train.py")
    return [
        sys.executable,
        train,
        "-f",
        EXP_FILE,
        "-expn",
        "run",
        "-b",
        "2",
        "--logger",
        "none",
        *flags,
        *opts,
    ]


def tiny_opts(description: str, out: Path, **overrides) -> list:
    """exp overrides for a seconds-long run at 64 px on the tiny set."""
    opts = {
        "dataset": description,
        "output_dir": str(out),
        "input_size": "(64,64)",
        "test_size": "(64,64)",
        "random_size": "(2,2)",
        "data_num_workers": 0,
        "max_epoch": 2,
        "no_aug_epochs": 1,
        "warmup_epochs": 1,
        "eval_interval": 1,
        "print_interval": 1,
        "basic_lr_per_img": 0.002,
        "seed": 0,
        "mosaic_prob": 0.5,  # the quick-start exp has none; resume and close_mosaic are tested with it
        "save_eval_report": False,  # the report has tests of its own (test_eval_report.py)
    }
    opts.update(overrides)
    return [str(x) for kv in opts.items() for x in kv]


def train_args(description: str, out: Path, *flags, **overrides):
    return load_tool("train").parse_args(
        ["-f", EXP_FILE, "-expn", "run", "-b", "4", *flags, *tiny_opts(description, out, **overrides)]
    )


def logged_iterations(log: Path):
    """[(epoch, iter, total_loss - l1_loss, lr)] of every progress line of a train_log.txt (1-based epoch
    and iter). The L1 term is left out: it joins only in the last epochs and would hide the trend."""
    return [
        (int(m[1]), int(m[3]), float(m[5]) - float(m[6]), float(m[7]))
        for m in (LOG_LINE.search(line) for line in log.read_text().splitlines())
        if m
    ]


def iters_per_epoch(log: Path) -> int:
    return int(LOG_LINE.search(log.read_text())[4])


@pytest.mark.slow
def test_short_run_learns_evaluates_every_epoch_and_checkpoints(tiny_shapes_coco, tmp_path):
    args = train_args(tiny_shapes_coco["config"], tmp_path, max_epoch=4, basic_lr_per_img=0.01, ema_ramp=50.0)
    run_training(args)
    run = tmp_path / "run"
    log = (run / "train_log.txt").read_text()
    steps = logged_iterations(run / "train_log.txt")
    per_epoch = iters_per_epoch(run / "train_log.txt")
    assert [(e, i) for e, i, _, _ in steps] == [(e, i) for e in range(1, 5) for i in range(1, per_epoch + 1)]
    first = [loss for e, _, loss, _ in steps if e == 1]
    last = [loss for e, _, loss, _ in steps if e == 4]
    assert sum(last) / len(last) < sum(first) / len(first) - 0.2  # it learns
    assert [int(e) for e in re.findall(r"eval epoch (\d+):", log)] == [1, 2, 3, 4]  # eval_interval 1
    # closed once, as YOLOX 0.3.0's trainer closes it: at epoch max_epoch - no_aug_epochs (1-based) = 3
    assert log.count("mosaic and mixup off") == 1
    assert log.index("mosaic and mixup off") > log.index("start epoch 3/4") > log.index("epoch 2/4 finished")
    for name in ("latest", "best", "last_mosaic_epoch"):
        assert (run / f"{name}_ckpt.pth").is_file(), name
    assert (run / "demo.jpg").is_file()
    ckpt = load_checkpoint(run / "latest_ckpt.pth")
    assert {
        "model",
        "raw_model",
        "ema",
        "optimizer",
        "scaler",
        "start_epoch",
        "iter",
        "best_ap",
        "class_names",
        "exp",
    } <= set(ckpt)
    assert ckpt["start_epoch"] == 4 and ckpt["iter"] == 0
    assert ckpt["ema"]["updates"] == len(steps) and ckpt["ema"]["ramp"] == 50.0  # the exp's ema_ramp
    assert ckpt["class_names"][:2] == ["circle", "square"]
    assert ckpt["exp"]["max_epoch"] == 4
    assert load_checkpoint(run / "last_mosaic_epoch_ckpt.pth")["start_epoch"] == 2  # 0-based: epoch 3
    assert any((run / "tensorboard").iterdir())


@pytest.mark.slow
def test_sigterm_mid_epoch_then_resume_loses_and_repeats_nothing(tiny_shapes_coco, tmp_path):
    opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, max_epoch=2, eval_interval=10)
    cmd = train_cmd(opts)
    log = tmp_path / "run" / "train_log.txt"
    with running(cmd) as proc:
        deadline = time.time() + 600  # a loaded machine can take minutes to get there
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and "epoch: 2/2, iter: 2/" in log.read_text():
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.02)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    ckpt = load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")
    per_epoch = iters_per_epoch(log)
    assert ckpt["start_epoch"] == 1 and 0 < ckpt["iter"] < per_epoch  # saved mid-epoch 2 (0-based 1)

    # the resume and the uninterrupted reference as typed, in this process: the signal needed the process
    resumed = run_tool_here("train", "--resume", *cmd[2:])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    steps = logged_iterations(log)
    positions = [(e, i) for e, i, _, _ in steps]
    assert sorted(positions) == [
        (e, i) for e in (1, 2) for i in range(1, per_epoch + 1)
    ]  # none lost or repeated
    final = load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")
    assert final["start_epoch"] == 2 and final["ema"]["updates"] == 2 * per_epoch
    exp = final["exp"]
    sched = LRScheduler(
        "yoloxwarmcos",
        exp["basic_lr_per_img"] * 2,
        per_epoch,
        2,
        warmup_epochs=1,
        warmup_lr_start=0,
        no_aug_epochs=1,
        min_lr_ratio=exp["min_lr_ratio"],
    )
    for e, i, _, lr in steps:  # the schedule continues where it stopped
        assert lr == pytest.approx(sched.update_lr((e - 1) * per_epoch + i - 1), rel=2e-3, abs=1e-9)

    # and so does the loss curve: weights, optimizer state and batch stream are those of a run
    # that was never interrupted
    reference = cmd[: cmd.index("-expn") + 1] + ["straight"] + cmd[cmd.index("-expn") + 2 :]
    assert run_tool_here("train", *reference[2:]).returncode == 0
    straight = {(e, i): loss for e, i, loss, _ in logged_iterations(tmp_path / "straight" / "train_log.txt")}
    for e, i, loss, _ in steps:
        assert loss == pytest.approx(straight[(e, i)], abs=2e-3), (e, i)


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "latest_ckpt.pth"
    save_checkpoint({"model": {"w": torch.zeros(1000)}, "start_epoch": 1}, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    args = train_args("shapes", tmp_path, "--resume", "-c", str(path))
    exp = get_exp(args.exp_file)
    exp.merge(args.opts)
    trainer = Trainer(exp, args)
    with pytest.raises(RuntimeError, match=f"{re.escape(str(path))}.*truncated or corrupt"):
        trainer.before_train()


def test_fp16_on_cpu_resolves_to_bf16_with_one_warning(monkeypatch):
    from loguru import logger

    monkeypatch.setattr(amp, "_warned_cpu_fp16", False)
    seen = []
    sink = logger.add(seen.append, level="WARNING")
    try:
        assert amp.amp_dtype(torch.device("cpu"), fp16=True) is torch.bfloat16
        assert amp.amp_dtype(torch.device("cpu"), fp16=True) is torch.bfloat16
        assert amp.amp_dtype(torch.device("cpu"), bf16=True) is torch.bfloat16
        assert amp.amp_dtype(torch.device("cpu")) is None
    finally:
        logger.remove(sink)
    assert len(seen) == 1 and "bfloat16" in seen[0]


@pytest.mark.slow
def test_fp16_flag_on_cpu_trains_in_bf16(tiny_shapes_coco, tmp_path):
    args = train_args(
        tiny_shapes_coco["config"], tmp_path, "--fp16", "--logger", "none", max_epoch=1, no_aug_epochs=0
    )
    run_training(args)
    log = (tmp_path / "run" / "train_log.txt").read_text()
    assert log.count("using bfloat16 autocast instead") == 1
    assert "bfloat16" in log.split("exp\n")[0]  # the start-up summary names the precision used
    steps = logged_iterations(tmp_path / "run" / "train_log.txt")
    assert steps and all(s[2] == s[2] and s[2] < float("inf") for s in steps)
    assert load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")["start_epoch"] == 1


@pytest.mark.slow
def test_ten_non_finite_losses_in_a_row_stop_and_save_nothing_from_them(
    tiny_shapes_coco, tmp_path, monkeypatch
):
    args = train_args(
        tiny_shapes_coco["config"], tmp_path, "--logger", "none", max_epoch=20, eval_interval=100
    )
    exp = get_exp(args.exp_file)
    exp.merge(args.opts)

    def nan_batches(inps, targets, size):
        return (inps * float("nan"), targets)

    monkeypatch.setattr(exp, "preprocess", nan_batches)
    trainer = Trainer(exp, args)
    latest = tmp_path / "run" / "latest_ckpt.pth"
    # 6 steps an epoch: the streak crosses the end of epoch 1, whose checkpoint holds untouched weights
    with pytest.raises(RuntimeError, match=f"non-finite for 10 iterations in a row.*weights are in {latest}"):
        trainer.train()
    log = (tmp_path / "run" / "train_log.txt").read_text()
    assert log.count("step not applied") == 10
    assert load_checkpoint(latest)["ema"]["updates"] == 0
    assert trainer.ema_model.updates == 0  # no step was taken on a non-finite loss
    state = trainer.model.state_dict()
    for k, v in state.items():  # weights and BN statistics untouched by the bad batches
        assert torch.isfinite(v.float()).all(), k
    assert int(state["backbone.backbone.stem.conv.bn.num_batches_tracked"]) == 0


@pytest.mark.slow
def test_signal_during_eval_saves_the_finished_epoch_not_a_step_to_repeat(
    tiny_shapes_coco, tmp_path, monkeypatch
):
    """Ctrl-C also kills the loader workers, so an eval after the signal fails: the checkpoint must
    still say "epoch 1 done", not "redo the last step of epoch 1"."""
    from yolox_fast.core.trainer import TrainingStopped

    args = train_args(tiny_shapes_coco["config"], tmp_path, "--logger", "none", max_epoch=3, eval_interval=1)
    exp = get_exp(args.exp_file)
    exp.merge(args.opts)
    trainer = Trainer(exp, args)

    def eval_after_ctrl_c(*_args, **_kwargs):
        trainer.stop_signal.signum = signal.SIGINT
        raise RuntimeError("DataLoader worker exited unexpectedly")

    monkeypatch.setattr(exp, "eval", eval_after_ctrl_c)
    with pytest.raises(TrainingStopped):
        trainer.train()
    ckpt = load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")
    assert (ckpt["start_epoch"], ckpt["iter"]) == (1, 0)
    assert ckpt["ema"]["updates"] == trainer.max_iter


def test_after_a_torchrun_restart_the_newest_checkpoint_wins_over_c(tiny_shapes_coco, tmp_path, monkeypatch):
    args = train_args(tiny_shapes_coco["config"], tmp_path, "--resume", "-c", str(tmp_path / "old.pth"))
    exp = get_exp(args.exp_file)
    exp.merge(args.opts)
    trainer = Trainer(exp, args)
    latest = Path(trainer.run_dir) / "latest_ckpt.pth"
    latest.parent.mkdir(parents=True, exist_ok=True)
    latest.write_bytes(b"")
    (tmp_path / "old.pth").write_bytes(b"")

    def resume_path():
        return resume_checkpoint_path(
            trainer.run_dir,
            args.resume,
            args.ckpt,
            args.auto_resume,
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        )

    assert resume_path() == str(tmp_path / "old.pth")  # first start: the user's -c
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resume_path() == str(latest)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-9), (torch.float32, 2e-3)])
def test_speed_switches_leave_a_training_step_equal(dtype, tolerance):
    """channels_last (default on) and the foreach SGD step change kernels, not results: the loss, the
    gradients and the weights after one step of a fixed batch agree. In float64 to 1e-9; in float32 within
    the float32 rounding of the step itself (its own distance from float64 is about 4e-4 here)."""
    from benchmarks.kit.inputs import random_targets

    gen = torch.Generator().manual_seed(0)
    imgs = (torch.rand(4, 3, 96, 96, generator=gen) * 255).to(dtype)
    targets = random_targets(4, 96, 80, gen).to(dtype)
    results = {}
    for fast in (False, True):
        exp = get_exp(exp_name="yolox-nano")
        torch.manual_seed(0)
        model = exp.get_model().to(dtype)
        fmt = torch.channels_last if fast else torch.contiguous_format
        model.to(memory_format=fmt)
        optimizer = exp.get_optimizer(64)
        for group in optimizer.param_groups:
            group["foreach"], group["lr"] = fast, 0.01
        loss = model(imgs.contiguous(memory_format=fmt), targets)["total_loss"]
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        optimizer.step()
        results[fast] = (loss.item(), grads, torch.cat([p.detach().flatten() for p in model.parameters()]))
    (loss_a, grad_a, w_a), (loss_b, grad_b, w_b) = results[False], results[True]
    assert loss_b == pytest.approx(loss_a, rel=tolerance)
    assert ((grad_b - grad_a).norm() / grad_a.norm()).item() < tolerance
    assert ((w_b - w_a).norm() / w_a.norm()).item() < tolerance
