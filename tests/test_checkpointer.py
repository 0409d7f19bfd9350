"""The Checkpointer without a Trainer: saving (full disk, non-finite weights, the interrupted position),
where a run starts again (resume, fine-tune, restarts, a damaged latest), the best score and the loss
scale."""

import errno

import pytest
import torch
from torch import nn

from yolox_fast.core.checkpointer import BestScore, Checkpointer, Saved, StartOptions, continue_loss_scale
from yolox_fast.core.nonfinite import NonFiniteGuard
from yolox_fast.utils.checkpoint import CheckpointError, load_checkpoint
from yolox_fast.utils.ema import ModelEMA


class Run:
    """A one-layer model with its optimizer, fp16 loss scaler, EMA and guard: the parts a checkpoint saves."""

    def __init__(self, run_dir, best_metric="AP50_95", fp16=True, seed=0):
        torch.manual_seed(seed)
        self.model = nn.Linear(3, 2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=4, enabled=fp16)
        self.ema = ModelEMA(self.model, ramp=10.0)
        guard = NonFiniteGuard(self.model, list(self.model.parameters()), self.scaler, False, str(run_dir))
        self.checkpointer = Checkpointer(str(run_dir), best_metric, StartOptions())
        self.checkpointer.saved = Saved(
            self.model, self.optimizer, self.scaler, self.ema, guard, lambda: {"class_names": ["a", "b"]}
        )

    def step(self) -> None:
        """One SGD step with momentum, and an EMA update, so that every saved part has moved."""
        self.optimizer.zero_grad()
        self.model(torch.ones(4, 3)).square().sum().backward()
        self.optimizer.step()
        self.ema.update(self.model)

    def start(self, max_epoch=10, **options):
        self.checkpointer.options = StartOptions(**options)
        return self.checkpointer.start(self.model, self.optimizer, self.scaler, max_epoch, torch.float16)


def test_a_saved_position_resumes_every_part_exactly(tmp_path):
    first = Run(tmp_path)
    first.step()
    first.checkpointer.best.record(0.3, 0.5, epoch=1)
    first.checkpointer.best.count(False, patience=5, epoch=2)
    path = first.checkpointer.save("latest", start_epoch=2, it=3, epoch=2)
    assert path == str(tmp_path / "latest_ckpt.pth")

    again = Run(tmp_path, seed=1)
    point = again.start(resume=True)
    assert (point.epoch, point.iter, point.finetune_from) == (2, 3, None)
    for a, b in zip(first.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)
    momentum = [s["momentum_buffer"] for s in again.optimizer.state.values()]
    assert all(torch.equal(a, s["momentum_buffer"]) for a, s in zip(momentum, first.optimizer.state.values()))
    assert again.checkpointer.best == BestScore("AP50_95", 0.3, 1, 1)
    assert again.checkpointer.finished == (2, 3)
    ckpt = point.ckpt
    assert ckpt["ema"]["updates"] == 1 and ckpt["class_names"] == ["a", "b"]
    ema = first.ema.ema.state_dict()
    assert all(
        torch.equal(ckpt["model"][k], ema[k]) for k in ema
    )  # "model": the EMA's, as YOLOX's tools read


def test_a_fresh_run_and_a_fine_tune_start_at_zero(tmp_path):
    assert Run(tmp_path).start() == Run(tmp_path).start(auto_resume=True)  # nothing to continue yet
    source = Run(tmp_path / "other")
    source.step()
    weights = source.checkpointer.save("latest", start_epoch=4, it=0, epoch=3)

    tuned = Run(tmp_path, seed=1)
    point = tuned.start(ckpt=weights)
    assert (point.epoch, point.iter, point.ckpt, point.finetune_from) == (0, 0, None, weights)
    assert torch.equal(tuned.model.weight, source.ema.ema.weight)  # the -c file's "model"


def test_the_first_start_obeys_e_and_a_restart_the_latest_position(tmp_path, monkeypatch):
    run = Run(tmp_path)
    run.checkpointer.save("latest", start_epoch=3, it=2, epoch=3)
    old = run.checkpointer.save("best", start_epoch=1, it=0, epoch=0)
    point = Run(tmp_path).start(resume=True, ckpt=old, start_epoch=2)
    assert (point.epoch, point.iter) == (1, 0)  # -e is 1-based

    monkeypatch.setenv(
        "TORCHELASTIC_RESTART_COUNT", "1"
    )  # torchrun restarted the job: latest wins over -c, -e
    point = Run(tmp_path).start(resume=True, ckpt=old, start_epoch=2)
    assert (point.epoch, point.iter) == (3, 2)


def test_a_resume_with_nothing_left_to_train_says_how_to_extend(tmp_path):
    Run(tmp_path).checkpointer.save("latest", start_epoch=3, it=0, epoch=2)
    with pytest.raises(ValueError, match="has trained 3 epochs and max_epoch is 3.*--resume max_epoch N"):
        Run(tmp_path).start(max_epoch=3, resume=True)


def test_a_damaged_latest_gives_way_to_the_checkpoint_furthest_in_training(tmp_path, log_lines):
    run = Run(tmp_path)
    for done in (1, 2):
        run.step()
        run.checkpointer.save_epoch(done, history=True)
    run.checkpointer.save("best", start_epoch=1, it=0, epoch=0)  # newer, but not as far
    latest = tmp_path / "latest_ckpt.pth"
    latest.write_bytes(latest.read_bytes()[:100])  # a copy cut short

    point = Run(tmp_path).start(resume=True)
    assert (point.epoch, point.iter) == (2, 0)
    assert any(f"cannot read checkpoint {latest}" in line for line in log_lines)
    assert any(f"resuming instead from {tmp_path / 'epoch_2_ckpt.pth'}" in line for line in log_lines)

    # a damaged file the user named (not the run's own latest) is an error, not a silent swap
    named = tmp_path / "named.pth"
    named.write_bytes(latest.read_bytes())
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        Run(tmp_path).start(resume=True, ckpt=str(named))
    for path in tmp_path.glob("*_ckpt.pth"):
        path.write_bytes(b"damaged")
    with pytest.raises(CheckpointError, match="no other checkpoint in .* can resume the run"):
        Run(tmp_path).start(resume=True)


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = Run(tmp_path)
    run.checkpointer.save_epoch(1, history=False)
    latest = tmp_path / "latest_ckpt.pth"
    before = latest.read_bytes()

    def disk_full(obj, f, *args, **kwargs):  # what a full disk does to the write
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    run.step()
    with pytest.raises(OSError, match="no space left on .* the previous latest_ckpt.pth, if any, is intact"):
        run.checkpointer.save_epoch(2, history=False)
    assert latest.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest_ckpt.pth"]  # no temporary file left


def test_non_finite_weights_are_never_saved(tmp_path):
    run = Run(tmp_path)
    run.checkpointer.save_epoch(1, history=False)
    before = (tmp_path / "latest_ckpt.pth").read_bytes()
    with torch.no_grad():
        run.model.weight[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite at epoch 2 .* latest_ckpt.pth was not written"):
        run.checkpointer.save_epoch(2, history=False)
    assert (tmp_path / "latest_ckpt.pth").read_bytes() == before


def test_an_interrupted_run_saves_the_last_finished_step(tmp_path):
    run = Run(tmp_path)
    run.checkpointer.finished = (1, 4)  # the step after it was cut short
    run.checkpointer.save_interrupted(epoch=1)
    saved = load_checkpoint(tmp_path / "latest_ckpt.pth")
    assert (saved["start_epoch"], saved["iter"]) == (1, 4)


def test_best_score_tracks_the_metric_and_spends_the_patience(log_lines):
    best = BestScore("AP50")
    assert best.record(0.2, 0.4, epoch=1) and not best.record(0.9, 0.4, epoch=2)  # AP50 did not improve
    assert (best.score, best.epoch) == (0.4, 1)
    assert not best.count(False, patience=2, epoch=2)
    assert best.count(False, patience=2, epoch=3)
    assert "early stop after epoch 3: AP50 has not improved for 2 evaluations (patience 2)" in log_lines[-1]
    assert not BestScore("AP50").count(False, patience=0, epoch=9)  # patience 0: never stops

    other = BestScore("AP50_95")
    other.resume(best.state())  # measured by another metric: the best restarts
    assert other == BestScore("AP50_95")
    with pytest.raises(ValueError, match="exp.best_metric must be one of"):
        Checkpointer("run", "mAP", StartOptions())


def test_the_loss_scale_continues_within_the_new_growth_interval(tmp_path, log_lines):
    state = {
        "scale": 8.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 4,
        "_growth_tracker": 3,
    }
    shorter = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=2)
    continue_loss_scale(shorter, state, "ckpt.pth", torch.float16)
    assert shorter.state_dict() == {**state, "growth_interval": 2, "_growth_tracker": 1}
    assert log_lines[-1] == "loss scale 8 continued from ckpt.pth"

    fp32 = torch.amp.GradScaler("cpu", enabled=False)
    continue_loss_scale(fp32, state, "ckpt.pth", None)
    assert log_lines[-1] == "ckpt.pth was trained in fp16: its loss scale is not used by this fp32 run"
    fresh = torch.amp.GradScaler("cpu", init_scale=256)
    continue_loss_scale(fresh, {}, "ckpt.pth", torch.float16)
    assert fresh.get_scale() == 256.0
    assert log_lines[-1] == "ckpt.pth was not trained in fp16: loss scaling starts at scale 256"
