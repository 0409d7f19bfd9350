"""Checkpointer: what a training run saves, where a run starts again, and which evaluation was the best.

- Saving: `<run_dir>/<name>_ckpt.pth` on rank 0, atomically (`utils/checkpoint.save_checkpoint`), after every
  rank checked that the weights are finite. The names: "latest" (each epoch's end, and a stop signal's
  position), "best" (`BestScore`), "last_mosaic_epoch" and, with `exp.save_history_ckpt`, "epoch_N".
- Starting: `start` reads the command line's `StartOptions` and the restart count (torchrun restarts, SLURM
  requeues): a fresh run, a fine-tune from -c, or a resume. A resume loads the raw weights, the optimizer, the
  best score with its patience count, the position, and continues the fp16 loss scale (`continue_loss_scale`);
  a damaged latest_ckpt.pth gives way to the newest good checkpoint of the run (`load_resume_checkpoint`).
- Best: `BestScore` keeps `exp.best_metric`'s best value ("best_ap" in the checkpoint, as YOLOX) and counts
  the evaluations since it towards `exp.patience`.

Nothing here reads the Trainer: tests/test_checkpointer.py drives it with a one-layer model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from loguru import logger
from torch import nn

from yolox_fast.core.best_metric import check_best_metric, metric_label, metric_value, resumed_best
from yolox_fast.core.nonfinite import NonFiniteGuard
from yolox_fast.utils.checkpoint import (
    load_checkpoint,
    load_model_weights,
    load_resume_checkpoint,
    restart_count,
    resume_checkpoint_path,
    save_checkpoint,
)
from yolox_fast.utils.ema import ModelEMA


@dataclass
class BestScore:
    """`metric`'s best value so far, the (1-based) epoch that gave it and the evaluations since without a
    better one. -inf: the first evaluation is always the best."""

    metric: str
    score: float = float("-inf")
    epoch: int = 0
    evals_since: int = 0

    def record(self, ap50_95: float, ap50: float, epoch: int) -> bool:
        """Whether the evaluation of (1-based) `epoch` beats the best; it then becomes the best."""
        value = metric_value(self.metric, ap50_95, ap50)
        if value <= self.score:
            return False
        self.score, self.epoch = value, epoch
        return True

    def count(self, improved: bool, patience: int, epoch: int) -> bool:
        """Count the evaluation after (1-based) `epoch` towards `patience` (0: none); True when the
        patience is spent (the run stops early, said in one line)."""
        self.evals_since = 0 if improved else self.evals_since + 1
        if not patience or self.evals_since < patience:
            return False
        logger.info(
            f"early stop after epoch {epoch}: {self.label} has not improved for {self.evals_since} "
            f"evaluations (patience {patience}); the best, {self.score:.4f} at epoch {self.epoch}, is in "
            "best_ckpt.pth"
        )
        return True

    @property
    def label(self) -> str:
        return metric_label(self.metric)

    def state(self) -> dict[str, Any]:
        return {
            "best_ap": self.score,
            "best_metric": self.metric,
            "best_epoch": self.epoch,
            "evals_since_best": self.evals_since,
        }

    def resume(self, ckpt: dict[str, Any]) -> None:
        self.score = resumed_best(ckpt, self.metric)
        if self.score != float("-inf"):  # measured by the same metric: the patience count goes on too
            self.epoch = int(ckpt.get("best_epoch", 0))
            self.evals_since = int(ckpt.get("evals_since_best", 0))


@dataclass(frozen=True)
class StartOptions:
    """The command line's say on where a run starts (tools/train.py's --resume, -c, --auto-resume, -e)."""

    resume: bool = False
    ckpt: str | None = None
    auto_resume: bool = False
    start_epoch: int | None = None  # 1-based, as YOLOX's -e

    @classmethod
    def from_args(cls, args) -> StartOptions:
        return cls(args.resume, args.ckpt, args.auto_resume, args.start_epoch)


@dataclass
class StartingPoint:
    """Where a run starts: (0-based) epoch and the iterations already done in it; a resume's checkpoint (for
    the EMA and the trackers), or the -c weights a fresh run fine-tunes from."""

    epoch: int = 0
    iter: int = 0
    ckpt: dict[str, Any] | None = None
    finetune_from: str | None = None


@dataclass
class Saved:
    """The live objects a checkpoint is made of, read at each save. `model` is the unwrapped (not DDP)
    model; `guard` (core/nonfinite.py) checks on every rank that the weights are finite; `run_info` gives
    the plain-data entries of the run (class names, exp fields, tracker runs)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    ema: ModelEMA | None
    guard: NonFiniteGuard
    run_info: Callable[[], dict[str, Any]] = field(default=dict)


class Checkpointer:
    """The checkpoints of the run in `run_dir` (written by rank 0), where it starts (`options`) and its best
    score (`best_metric`)."""

    def __init__(
        self, run_dir: str, best_metric: str, options: StartOptions, rank: int = 0, device: Any = "cpu"
    ) -> None:
        self.run_dir = run_dir
        self.options = options
        self.rank = rank
        self.device = device  # where a resume loads the checkpoint's tensors
        self.best = BestScore(check_best_metric(best_metric))
        self.saved: Saved | None = None  # set once the run's parts exist
        self.finished = (0, 0)  # (epoch, iterations done in it) of the last completed step or epoch save

    # ------------------------------------------------------------------ starting
    def start(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        max_epoch: int,
        amp_dtype: torch.dtype | None = None,
    ) -> StartingPoint:
        """Resume into `model`, `optimizer` and `scaler` (the checkpoint's best score into `self.best`), or
        load the -c weights for a fine-tune, or nothing for a fresh run."""
        options = self.options
        restarts = restart_count()
        path = resume_checkpoint_path(
            self.run_dir, options.resume, options.ckpt, options.auto_resume, restarts
        )
        if path is None:
            if not options.ckpt:
                return StartingPoint()
            load_model_weights(model, load_checkpoint(options.ckpt))
            logger.info(f"fine-tuning from {options.ckpt}")
            return StartingPoint(finetune_from=options.ckpt)
        # the run's own latest_ckpt.pth, when damaged, gives way to the newest good checkpoint of the run
        latest = os.path.join(self.run_dir, "latest_ckpt.pth")
        path, ckpt = load_resume_checkpoint(path, map_location=self.device, fall_back=path == latest)
        model.load_state_dict(ckpt.get("raw_model") or ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        continue_loss_scale(scaler, ckpt.get("scaler") or {}, path, amp_dtype)
        self.best.resume(ckpt)
        if options.start_epoch is not None and restarts == 0:  # -e is 1-based, as in YOLOX
            point = StartingPoint(options.start_epoch - 1, 0, ckpt)
        else:
            point = StartingPoint(int(ckpt["start_epoch"]), int(ckpt.get("iter", 0)), ckpt)
        if point.epoch >= max_epoch and options.resume and restarts == 0:
            raise ValueError(
                f"{path} has trained {point.epoch} epochs and max_epoch is {max_epoch}: nothing is left to "
                f"train; to train longer, extend it: --resume max_epoch N with N > {point.epoch}"
            )
        logger.info(f"resumed from {path}: epoch {point.epoch + 1}, iteration {point.iter} within it")
        self.finished = (point.epoch, point.iter)
        return point

    # ------------------------------------------------------------------ saving
    def state(self, start_epoch: int, it: int) -> dict[str, Any]:
        """Everything needed to continue exactly at iteration `it` of epoch `start_epoch`."""
        parts = self.saved
        return {
            # "model" holds the EMA weights, what official YOLOX tools (eval, demo, export) read
            "model": (parts.ema.ema if parts.ema is not None else parts.model).state_dict(),
            "raw_model": parts.model.state_dict(),
            "ema": parts.ema.state_dict() if parts.ema is not None else None,
            "optimizer": parts.optimizer.state_dict(),
            "scaler": parts.scaler.state_dict(),
            "start_epoch": start_epoch,
            "iter": it,
            **self.best.state(),
            **parts.run_info(),
        }

    def save(self, name: str, start_epoch: int, it: int, epoch: int) -> str | None:
        """Write `<run_dir>/<name>_ckpt.pth` on rank 0 (atomically); returns its path there. `epoch`: the
        (0-based) epoch in training, for the message when the weights are not finite.

        Weights with a non-finite value are never written (over a good checkpoint or at all): every rank
        checks, and all raise together, naming the files that still hold good weights.
        """
        parts = self.saved
        states = [parts.model.state_dict()] + ([parts.ema.ema.state_dict()] if parts.ema is not None else [])
        parts.guard.check_weights(states, name, epoch)
        if self.rank != 0:
            return None
        path = os.path.join(self.run_dir, f"{name}_ckpt.pth")
        save_checkpoint(self.state(start_epoch, it), path)
        logger.info(f"saved {path} (resumes at epoch {start_epoch + 1}, iteration {it})")
        return path

    def save_epoch(self, done: int, history: bool) -> None:
        """After (1-based) epoch `done`: latest_ckpt.pth, and epoch_<done>_ckpt.pth with `history`."""
        self.save("latest", start_epoch=done, it=0, epoch=done - 1)
        self.finished = (done, 0)
        if history:
            self.save(f"epoch_{done}", start_epoch=done, it=0, epoch=done - 1)

    def save_interrupted(self, epoch: int) -> str | None:
        """latest_ckpt.pth at the position of the last completed step (`finished`), whatever was interrupted
        after it (the next batch, the multi-scale broadcast, an eval), so a resume neither repeats nor skips
        a step. `epoch`: the (0-based) epoch in training."""
        start_epoch, done_in_epoch = self.finished
        return self.save("latest", start_epoch=start_epoch, it=done_in_epoch, epoch=epoch)


def resume_ema(ema: ModelEMA, ckpt: dict[str, Any], progress: int) -> None:
    """The EMA of a run resumed from `ckpt` after `progress` optimizer steps: the checkpoint's "model" weights
    and its "ema" update count (a checkpoint without one, official YOLOX's, counts one update a step)."""
    ema.load_state_dict(ckpt.get("ema") or {"updates": progress}, ckpt["model"])


def continue_loss_scale(
    scaler: torch.amp.GradScaler, state: dict[str, Any], path: Any, amp_dtype: torch.dtype | None
) -> None:
    """Continue a checkpoint's loss scale (`state`: its "scaler", {} when it was not fp16) in `scaler` when
    this run (in `amp_dtype`) scales the loss; a change of precision across the resume is said, never an
    error."""
    if not scaler.is_enabled():
        if state:
            precision = str(amp_dtype).replace("torch.", "") if amp_dtype else "fp32"
            logger.info(f"{path} was trained in fp16: its loss scale is not used by this {precision} run")
        return
    if not state:
        logger.info(f"{path} was not trained in fp16: loss scaling starts at scale {scaler.get_scale():g}")
        return
    # the checkpoint says where the scale stands, the exp how it moves (a resume may change that); a
    # growth count at or past a shorter interval would never reach it again, hence the cap
    interval = scaler.get_growth_interval()
    tracker = min(int(state["_growth_tracker"]), interval - 1)
    scaler.load_state_dict({**state, "growth_interval": interval, "_growth_tracker": tracker})
    logger.info(f"loss scale {scaler.get_scale():g} continued from {path}")
