"""Trainer: the YOLOX training loop (native AMP, DDP, EMA, multi-scale, exact resume, signal-safe
checkpoints).

Reading order: `train` -> `before_train` -> per epoch `before_epoch`, `train_in_epoch` (calls
`train_one_iter`, the whole step in one straight line) and `after_epoch` -> `after_train`.
"""

from __future__ import annotations

import datetime
import inspect
import os
import platform
import random
import signal
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from loguru import logger
from tabulate import tabulate
from torch import nn

from yolox_fast.core.best_metric import check_best_metric, metric_label, metric_value, resumed_best
from yolox_fast.core.demo import DEMO_CONF, DEMO_NMS, write_demo_image
from yolox_fast.core.launch import launcher_name
from yolox_fast.data.datasets.base import CorruptImageError
from yolox_fast.evaluators.report import record_training_eval
from yolox_fast.inference import Predictor
from yolox_fast.models.folded_bn import has_folded_bn, refit_folded_bn
from yolox_fast.utils import dist as dist_utils
from yolox_fast.utils.amp import amp_dtype, autocast
from yolox_fast.utils.checkpoint import (
    load_checkpoint,
    load_model_weights,
    restart_count,
    resume_checkpoint_path,
    save_checkpoint,
)
from yolox_fast.utils.ema import ModelEMA, unwrap_model
from yolox_fast.utils.logger import setup_logger
from yolox_fast.utils.metric import MeterBuffer, memory_mb
from yolox_fast.utils.run_lock import RunLockError, claim_output_folder

# BN statistics stay per rank while training, as in YOLOX (they are averaged before each eval);
# newer torch names the switch forward_sync_buffers and deprecates broadcast_buffers
_NO_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(nn.parallel.DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)
MAX_NONFINITE_STREAK = 10  # consecutive non-finite losses before training stops
MULTISCALE_EVERY = 10  # iterations between two draws of the multi-scale input size
LOSS_KEYS = ("total_loss", "iou_loss", "l1_loss", "conf_loss", "cls_loss", "num_fg")


class TrainingStopped(Exception):
    """Raised after a SIGINT/SIGTERM was handled: the checkpoint is written, the process should exit."""

    def __init__(self, signum: int, path: str | None) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.path = path


@torch.no_grad()
def sync_bn_stats(model: nn.Module) -> None:
    """Average BatchNorm running mean/var over ranks, so every rank evaluates the same model.

    DDP averages gradients, not buffers: with broadcast_buffers=False each rank's BN statistics
    drift on its own shard of the data.
    """
    world = dist_utils.get_world_size()
    if world == 1:
        return
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            for buf in (m.running_mean, m.running_var):
                dist_utils.all_reduce_sum(buf)
                buf.div_(world)


def bn_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The running statistics of every BatchNorm that tracks them (restored after a skipped step)."""
    return [
        buf
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        for buf in (m.running_mean, m.running_var, m.num_batches_tracked)
    ]


def _short(value: Any, width: int = 32) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class Trainer:
    """Trains `exp`'s model as the command line `args` (tools/train.py's parser) asks.

    `args.batch_size` is the total batch over all ranks. Checkpoints and logs go to
    `<exp.output_dir>/<args.experiment_name>/`.
    """

    def __init__(self, exp, args) -> None:
        exp.validate()
        self.exp = exp
        self.args = args
        self.max_epoch = exp.max_epoch
        self.rank = dist_utils.get_rank()
        self.local_rank = dist_utils.get_local_rank()
        self.world_size = dist_utils.get_world_size()
        self.is_distributed = self.world_size > 1
        if args.batch_size % self.world_size:
            raise ValueError(
                f"-b {args.batch_size} must be a multiple of the number of processes ({self.world_size})"
            )
        self.batch_size = args.batch_size
        self.device = dist_utils.local_device()
        self.file_name = os.path.join(exp.output_dir, args.experiment_name)
        setup_logger(self.file_name, distributed_rank=self.rank, filename="train_log.txt", mode="a")

        self.amp_dtype = amp_dtype(self.device, fp16=args.fp16, bf16=args.bf16)
        # loss scaling is only needed for fp16: bf16 has fp32's exponent range
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype is torch.float16)

        self.input_size = tuple(exp.input_size)
        self.best_metric = check_best_metric(getattr(exp, "best_metric", "AP50_95"))  # what best_ckpt keeps
        self.best_ap = float("-inf")  # so the first evaluation always writes best_ckpt.pth
        self.best_epoch = 0  # the (1-based) epoch whose evaluation gave best_ap
        self.evals_since_best = 0  # evaluations in a row without a better best_ap (exp.patience)
        self.stopped_early = False
        self.finetune_from: str | None = None  # the -c weights a fresh (not resumed) run starts from
        self.start_epoch = 0
        self.start_iter = 0  # iterations already done inside start_epoch (mid-epoch resume)
        self._finished = (0, 0)  # (epoch, iterations done in it) of the last completed step or epoch save
        self.epoch = 0
        self.iter = 0
        self.no_aug = False
        self.meter = MeterBuffer(window=exp.print_interval)
        self.tblogger = None
        self.ema_model: ModelEMA | None = None
        self._stop_signum: int | None = None
        self._nonfinite_streak = 0

    # ------------------------------------------------------------------ the loop
    def train(self) -> None:
        self.before_train()
        try:
            for epoch in range(self.start_epoch, self.max_epoch):
                self.epoch = epoch
                self.before_epoch()
                self.train_in_epoch()
                self.after_epoch()
                if self.stopped_early:
                    break
        except TrainingStopped:
            raise
        except Exception:
            # a signal made the data loader or a collective fail before the step finished: the
            # weights are those of the last finished iteration, which is what gets saved
            if self._stop_signum is None:
                raise
            raise TrainingStopped(self._stop_signum, self._save_interrupted()) from None
        finally:
            self._restore_signal_handlers()
        self.after_train()

    def train_in_epoch(self) -> None:
        first = self.start_iter if self.epoch == self.start_epoch else 0
        for it in range(first, self.max_iter):
            self.iter = it
            stop = self.train_one_iter()
            if stop:
                raise TrainingStopped(self._stop_signum or signal.SIGTERM, self._save_interrupted())

    def train_one_iter(self) -> bool:
        """One optimisation step; returns True when every rank agreed to stop after it (signal)."""
        t0 = time.perf_counter()
        inps, targets = self._next_batch()
        inps, targets = self.exp.preprocess(inps, targets, self.input_size)
        data_time = time.perf_counter() - t0
        self._log_batch_images(inps, targets)
        lr = self._set_lr(self.progress_in_iter)
        self._snapshot_bn_stats()

        with autocast(self.device, self.amp_dtype):
            outputs = self.model(inps, targets)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(outputs["total_loss"]).backward()
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)  # true gradients for the finiteness check and the clip

        bad_loss, bad_grads, stop = self._agree_on_flags(outputs["total_loss"])
        skip = bad_loss or bad_grads
        if skip:
            self._on_bad_step(outputs, bad_loss)
        else:
            self._nonfinite_streak = 0
            if self.exp.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(self._params, self.exp.clip_grad_norm)
            self.scaler.step(self.optimizer)
            if self.ema_model is not None:
                self.ema_model.update(self.model)
        self.scaler.update()  # fp16: an overflow lowers the loss scale
        self._finished = (self.epoch, self.iter + 1)

        if (self.progress_in_iter + 1) % MULTISCALE_EVERY == 0:
            self.input_size = tuple(
                self.exp.random_resize(self.train_loader, self.epoch, self.rank, self.is_distributed)
            )
        if not skip:
            self.meter.update(
                iter_time=time.perf_counter() - t0,
                data_time=data_time,
                lr=lr,
                **{k: outputs[k] for k in LOSS_KEYS if k in outputs},
            )
        self._log_progress()
        return stop

    # ------------------------------------------------------------------ phases
    def before_train(self) -> None:
        self._seed()
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        model = self.exp.get_model().to(self.device)
        self.memory_format = torch.channels_last if self.exp.channels_last else torch.contiguous_format
        model.to(memory_format=self.memory_format)
        self.optimizer = self.exp.get_optimizer(self.batch_size)
        ckpt = self._load_starting_point(model)

        self.no_aug = self.start_epoch >= self.mosaic_close_epoch
        self.exp.prepare_dataset()
        self.train_loader = self.exp.get_data_loader(
            batch_size=self.batch_size // self.world_size,
            is_distributed=self.is_distributed,
            no_aug=self.no_aug,
            cache_img=self.args.cache,
        )
        self.class_names = tuple(self.train_loader.dataset.class_names)
        if self.finetune_from and self.exp.refit_folded_bn and has_folded_bn(model):
            self._refit_folded_bn(model, self.train_loader.dataset.dataset)
        trainable = model.freeze(self.exp.freeze)
        total = sum(p.numel() for p in model.parameters())
        logger.info(f"trainable parameters: {trainable:,} of {total:,} (freeze: {self.exp.freeze})")
        self.max_iter = len(self.train_loader)
        # a resumed run continues the batch stream where it stopped (the same batches, given exp.seed)
        self.train_loader.skip_to(self.progress_in_iter_at(self.start_epoch, self.start_iter))
        self._finished = (self.start_epoch, self.start_iter)
        self.batches = iter(self.train_loader)  # endless: the loader restarts itself
        self.lr_scheduler = self.exp.get_lr_scheduler(
            self.exp.basic_lr_per_img * self.batch_size, self.max_iter
        )
        if self.no_aug:
            model.head.use_l1 = True
        if self.exp.grad_checkpoint:
            logger.info(
                "activation checkpointing on (`python tools/benchmark.py train --grad-checkpoint` "
                "measures its memory saving)"
            )

        if self.exp.ema:
            self.ema_model = ModelEMA(model, 0.9998, ramp=self.exp.ema_ramp)
            if ckpt is not None:
                self.ema_model.load_state_dict(
                    ckpt.get("ema") or {"updates": self.start_epoch * self.max_iter + self.start_iter},
                    ckpt["model"],
                )
        if self.is_distributed:
            model = nn.parallel.DistributedDataParallel(
                model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                **_NO_BUFFER_SYNC,
            )
        self.model = model
        self.model.train()
        model = unwrap_model(model)
        self._params = [p for p in model.parameters() if p.requires_grad]
        # BatchNorm running statistics, copied before each step so a skipped step can put them back
        self._bn_stats = bn_buffers(model)
        self._bn_backup = [b.clone() for b in self._bn_stats]
        self.evaluator = self.exp.get_evaluator(
            batch_size=self.batch_size // self.world_size, is_distributed=self.is_distributed
        )
        if self.rank == 0 and self.args.logger == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.tblogger = SummaryWriter(os.path.join(self.file_name, "tensorboard"))
        self._install_signal_handlers()
        self._log_summary()
        self.train_start = time.perf_counter()
        self.start_progress = self.progress_in_iter_at(self.start_epoch, self.start_iter)

    def before_epoch(self) -> None:
        logger.info(f"---> start epoch {self.epoch + 1}/{self.max_epoch}")
        if self.epoch >= self.mosaic_close_epoch and not self.no_aug:
            # from here on un-augmented images, the L1 box loss, and an eval every epoch
            logger.info("---> mosaic and mixup off, L1 loss on, eval every epoch from now on")
            self.train_loader.close_mosaic()
            unwrap_model(self.model).head.use_l1 = True
            self.no_aug = True
            self.save_ckpt("last_mosaic_epoch", start_epoch=self.epoch, it=0)

    def after_epoch(self) -> None:
        done = self.epoch + 1
        self.save_ckpt("latest", start_epoch=done, it=0)
        self._finished = (done, 0)
        if self.exp.save_history_ckpt:
            self.save_ckpt(f"epoch_{done}", start_epoch=done, it=0)
        logger.info(f"epoch {done}/{self.max_epoch} finished")
        due = done % self.exp.eval_interval == 0 or self.no_aug or done == self.max_epoch
        if not due:
            return
        improved = self.evaluate_and_save_model()
        self.evals_since_best = 0 if improved else self.evals_since_best + 1
        patience = self.exp.patience
        if patience and self.evals_since_best >= patience and done < self.max_epoch:
            self.stopped_early = True
            logger.info(
                f"early stop after epoch {done}: {metric_label(self.best_metric)} has not improved for "
                f"{self.evals_since_best} evaluations (patience {patience}); the best, {self.best_ap:.4f} at "
                f"epoch {self.best_epoch}, is in best_ckpt.pth"
            )
        # latest also records the new best and the count towards patience, so a resumed run goes on from them
        self.save_ckpt("latest", start_epoch=done, it=0)

    def after_train(self) -> None:
        minutes = (time.perf_counter() - self.train_start) / 60
        logger.info(
            f"training done in {minutes:.1f} min; best {metric_label(self.best_metric)} {self.best_ap:.4f}"
        )
        if self.rank == 0:
            self._write_demo_image()
        if self.tblogger is not None:
            self.tblogger.close()
        dist_utils.synchronize()

    # ------------------------------------------------------------------ evaluation
    def evaluate_and_save_model(self) -> bool:
        """Evaluate the EMA model; save best_ckpt.pth when exp.best_metric improves, write the eval
        report (tables, pictures). Returns whether it improved."""
        eval_model = self.ema_model.ema if self.ema_model is not None else unwrap_model(self.model)
        if self.is_distributed:
            sync_bn_stats(eval_model)
        t0 = time.perf_counter()
        ap50_95, ap50, summary = self.exp.eval(eval_model, self.evaluator, self.is_distributed)
        self.model.train()
        # the evaluator returns the same numbers on every rank; broadcast anyway so that the
        # "best" decision, and with it every rank's control flow, cannot diverge
        ap50_95, ap50 = dist_utils.broadcast_object((float(ap50_95), float(ap50)))
        value = metric_value(self.best_metric, ap50_95, ap50)
        improved = value > self.best_ap
        if improved:
            self.best_ap, self.best_epoch = value, self.epoch + 1
        logger.info(
            f"eval epoch {self.epoch + 1}: AP50:95 {ap50_95:.4f}  AP50 {ap50:.4f}  "
            f"(best {metric_label(self.best_metric)} {self.best_ap:.4f}, {time.perf_counter() - t0:.1f} s)"
            f"\n{summary}"
        )
        if self.tblogger is not None:
            self.tblogger.add_scalar("val/AP50_95", ap50_95, self.epoch + 1)
            self.tblogger.add_scalar("val/AP50", ap50, self.epoch + 1)
        if improved:
            self.save_ckpt("best", start_epoch=self.epoch + 1, it=0)
        # rank 0 (the one that scored) writes eval/ and, when improved, best_eval/; never raises
        record_training_eval(
            self.evaluator, self.exp, self.file_name, self.tblogger, self.epoch + 1, improved
        )
        dist_utils.synchronize()
        return improved

    @property
    def mosaic_close_epoch(self) -> int:
        """The (0-based) epoch from which mosaic and mixup are off and L1 is on.

        As YOLOX 0.3.0's trainer (`epoch + 1 == max_epoch - no_aug_epochs`): one epoch before the lr's
        flat tail of no_aug_epochs begins, so no_aug_epochs + 1 epochs train without mosaic (the last
        one too when no_aug_epochs is 0). Kept so that the same recipe trains the same here.
        """
        return max(0, self.max_epoch - self.exp.no_aug_epochs - 1)

    # ------------------------------------------------------------------ checkpoints
    @property
    def progress_in_iter(self) -> int:
        return self.progress_in_iter_at(self.epoch, self.iter)

    def progress_in_iter_at(self, epoch: int, it: int) -> int:
        return epoch * self.max_iter + it

    def checkpoint_state(self, start_epoch: int, it: int) -> dict[str, Any]:
        """Everything needed to continue exactly at iteration `it` of epoch `start_epoch`."""
        raw = unwrap_model(self.model)
        return {
            # "model" holds the EMA weights, what official YOLOX tools (eval, demo, export) read
            "model": (self.ema_model.ema if self.ema_model is not None else raw).state_dict(),
            "raw_model": raw.state_dict(),
            "ema": self.ema_model.state_dict() if self.ema_model is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "start_epoch": start_epoch,
            "iter": it,
            "best_ap": self.best_ap,
            "best_metric": self.best_metric,
            "best_epoch": self.best_epoch,
            "evals_since_best": self.evals_since_best,
            "class_names": list(self.class_names),
            "exp": self.exp.fields(),
        }

    def save_ckpt(self, name: str, start_epoch: int, it: int) -> str | None:
        """Write `<file_name>/<name>_ckpt.pth` on rank 0 (atomically); returns its path there.

        Weights with a non-finite value are never written (over a good checkpoint or at all): every rank
        checks, and all raise together, naming the files that still hold good weights.
        """
        self._check_finite_weights(name)
        if self.rank != 0:
            return None
        path = os.path.join(self.file_name, f"{name}_ckpt.pth")
        save_checkpoint(self.checkpoint_state(start_epoch, it), path)
        logger.info(f"saved {path} (resumes at epoch {start_epoch + 1}, iteration {it})")
        return path

    def _check_finite_weights(self, name: str) -> None:
        states = [unwrap_model(self.model).state_dict()]
        if self.ema_model is not None:
            states.append(self.ema_model.ema.state_dict())
        named = [(k, t) for state in states for k, t in state.items() if t.is_floating_point()]
        finite = torch.stack(torch._foreach_norm([t for _, t in named], float("inf"))).isfinite()
        all_finite = finite.all().float()
        if self.is_distributed:
            dist.all_reduce(all_finite, op=dist.ReduceOp.MIN)
        if bool(all_finite):
            return
        bad = [k for (k, _), ok in zip(named, finite.tolist()) if not ok]
        raise RuntimeError(
            f"the weights became non-finite at epoch {self.epoch + 1} ({len(bad)} of {len(named)} tensors, "
            f"e.g. {bad[0] if bad else 'on another rank'}): {name}_ckpt.pth was not written. "
            f"{self._last_good_checkpoints()} Try a lower learning rate (basic_lr_per_img), a longer warmup "
            "or clip_grad_norm 10."
        )

    def _save_interrupted(self) -> str | None:
        # the position of the last completed step, whatever was interrupted after it (the next
        # batch, the multi-scale broadcast, an eval), so a resume neither repeats nor skips a step
        epoch, done_in_epoch = self._finished
        return self.save_ckpt("latest", start_epoch=epoch, it=done_in_epoch)

    def _load_starting_point(self, model: nn.Module) -> dict[str, Any] | None:
        """Resume (returns the checkpoint for the EMA) or fine-tune from -c (returns None)."""
        path = resume_checkpoint_path(
            self.file_name, self.args.resume, self.args.ckpt, self.args.auto_resume, restart_count()
        )
        if path is None:
            if self.args.ckpt:
                ckpt = load_checkpoint(self.args.ckpt)
                load_model_weights(model, ckpt)
                logger.info(f"fine-tuning from {self.args.ckpt}")
                self.finetune_from = self.args.ckpt
            return None
        ckpt = load_checkpoint(path, map_location=self.device)
        model.load_state_dict(ckpt.get("raw_model") or ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(ckpt["scaler"])
        self.best_ap = resumed_best(ckpt, self.best_metric)
        if self.best_ap != float("-inf"):  # measured by the same metric: the patience count goes on too
            self.best_epoch = int(ckpt.get("best_epoch", 0))
            self.evals_since_best = int(ckpt.get("evals_since_best", 0))
        if self.args.start_epoch is not None and restart_count() == 0:  # -e is 1-based, as in YOLOX
            self.start_epoch, self.start_iter = self.args.start_epoch - 1, 0
        else:
            self.start_epoch, self.start_iter = int(ckpt["start_epoch"]), int(ckpt.get("iter", 0))
        logger.info(
            f"resumed from {path}: epoch {self.start_epoch + 1}, iteration {self.start_iter} within it"
        )
        return ckpt

    def _refit_folded_bn(self, model: nn.Module, dataset, count: int = 128, batch: int = 8) -> None:
        """Re-estimate the BatchNorm statistics of folded -c weights on `count` training images (spread
        over the set, letterboxed as for evaluation), so training starts from the weights' function."""
        indices = np.unique(np.linspace(0, len(dataset) - 1, min(count, len(dataset))).round().astype(int))
        images = torch.from_numpy(np.stack([dataset[int(i)][0] for i in indices]))
        seen = refit_folded_bn(
            model,
            (b.to(self.device).contiguous(memory_format=self.memory_format) for b in images.split(batch)),
        )
        logger.info(
            f"{self.finetune_from}: its BatchNorm layers carry identity statistics (folded into the "
            f"convolutions, as in weights rebuilt from an ONNX export); re-estimated them on {seen} training "
            "images so that training starts from these weights' function (refit_folded_bn False keeps them)"
        )

    # ------------------------------------------------------------------ step helpers
    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch on the device: images uint8 from the loader, float32 0-255 from here on."""
        imgs, targets = next(self.batches)[:2]
        non_blocking = self.device.type == "cuda"
        imgs = (
            imgs.to(self.device, non_blocking=non_blocking)
            .float()
            .contiguous(memory_format=self.memory_format)
        )
        return imgs, targets.to(self.device, non_blocking=non_blocking)

    def _set_lr(self, progress: int) -> float:
        lr = self.lr_scheduler.update_lr(progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _snapshot_bn_stats(self) -> None:
        torch._foreach_copy_(self._bn_backup, self._bn_stats)

    def _restore_bn_stats(self) -> None:
        torch._foreach_copy_(self._bn_stats, self._bn_backup)

    def _agree_on_flags(self, loss: torch.Tensor) -> tuple[bool, bool, bool]:
        """(non-finite loss on some rank, non-finite gradient, a stop signal on some rank), agreed by all
        ranks in one collective: a rank that skipped the step while others took it would hang DDP.

        Gradients are identical on every rank after DDP's all-reduce, so one rank's NaN loss makes every
        rank's gradients non-finite: the whole step is skipped everywhere. One host sync per step.
        """
        grads = [p.grad for p in self._params if p.grad is not None]
        grads_finite = torch.stack(torch._foreach_norm(grads, float("inf"))).isfinite().all()
        flags = torch.stack(
            [
                (~torch.isfinite(loss.detach())).float(),
                (~grads_finite).float(),
                torch.tensor(float(self._stop_signum is not None), device=loss.device),
            ]
        )
        if self.is_distributed:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        bad_loss, bad_grads, stop = flags.tolist()
        return bool(bad_loss), bool(bad_grads), bool(stop)

    def _on_bad_step(self, outputs: dict[str, torch.Tensor], bad_loss: bool) -> None:
        """A step with a non-finite loss or gradient is not applied; ten in a row stop the run."""
        if not bad_loss and self.scaler.is_enabled() and self.scaler.get_scale() >= 1.0:
            # fp16 overflow at a loss scale >= 1: the scaler's own business (it lowers the scale), and
            # the statistics of the forward pass are sound
            return
        self._restore_bn_stats()  # the forward pass already folded the bad batch into them
        self._nonfinite_streak += 1
        values = ", ".join(f"{k} {float(outputs[k]):.4g}" for k in LOSS_KEYS if k in outputs)
        what = "loss" if bad_loss else "gradient (the loss was finite)"
        logger.warning(
            f"non-finite {what} at epoch {self.epoch + 1} iter {self.iter + 1} ({values}): step not applied "
            f"({self._nonfinite_streak}/{MAX_NONFINITE_STREAK} in a row)"
        )
        if self._nonfinite_streak >= MAX_NONFINITE_STREAK:
            raise RuntimeError(
                f"training stopped: the loss or its gradient was non-finite for {MAX_NONFINITE_STREAK} "
                f"iterations in a row (epoch {self.epoch + 1}, iter {self.iter + 1}); nothing was saved "
                f"from the diverged weights. {self._last_good_checkpoints()} Try a lower learning rate "
                "(basic_lr_per_img), a longer warmup, clip_grad_norm 10, or --bf16 instead of --fp16."
            )

    def _last_good_checkpoints(self) -> str:
        """Where the last good weights are: a sentence naming the files and their positions."""
        found = []
        for name in ("latest", "best"):
            path = os.path.join(self.file_name, f"{name}_ckpt.pth")
            if os.path.isfile(path):
                ckpt = load_checkpoint(path)
                found.append(f"{path} (resumes at epoch {int(ckpt['start_epoch']) + 1})")
        if not found:
            return "No checkpoint had been written before the divergence."
        return "The last good weights are in " + " and ".join(found) + "."

    def _log_progress(self) -> None:
        if (self.iter + 1) % self.exp.print_interval != 0 or "iter_time" not in self.meter:
            return
        iter_time = self.meter["iter_time"].avg
        done = self.progress_in_iter + 1 - self.start_progress
        left = self.max_epoch * self.max_iter - self.progress_in_iter - 1
        # mean over all iterations of this run, so the ETA does not swing with multi-scale sizes
        eta = (time.perf_counter() - self.train_start) / max(1, done) * left
        losses = ", ".join(f"{k}: {self.meter[k].avg:.3f}" for k in LOSS_KEYS if k in self.meter)
        logger.info(
            f"epoch: {self.epoch + 1}/{self.max_epoch}, iter: {self.iter + 1}/{self.max_iter}, "
            f"mem: {memory_mb(self.device):.0f}Mb, iter_time: {iter_time:.3f}s, "
            f"data_time: {self.meter['data_time'].avg:.3f}s, {losses}, lr: {self.meter['lr'].latest:.3e}, "
            f"size: {self.input_size[0]}x{self.input_size[1]}, img/s: {self.batch_size / iter_time:.1f}, "
            f"ETA: {datetime.timedelta(seconds=int(eta))}"
        )
        if self.tblogger is not None:
            step = self.progress_in_iter + 1
            self.tblogger.add_scalar("train/lr", self.meter["lr"].latest, step)
            for k in LOSS_KEYS:
                if k in self.meter:
                    self.tblogger.add_scalar(f"train/{k}", self.meter[k].avg, step)

    def _log_batch_images(self, inps: torch.Tensor, targets: torch.Tensor, count: int = 4) -> None:
        """A few training images with their boxes in TensorBoard: first iteration of the run and of the
        no-aug phase."""
        if self.tblogger is None or self.iter != 0:
            return
        first_no_aug = self.epoch == self.mosaic_close_epoch
        if self.epoch != self.start_epoch and not first_no_aug:
            return
        import cv2

        drawn = []
        for img, labels in zip(inps[:count].detach().float().cpu(), targets[:count].detach().float().cpu()):
            canvas = np.ascontiguousarray(
                img.clamp(0, 255).byte().permute(1, 2, 0).numpy()[..., ::-1]
            )  # BGR -> RGB
            for cls, cx, cy, w, h in labels[labels.sum(1) > 0].tolist():
                p1 = (int(cx - w / 2), int(cy - h / 2))
                p2 = (int(cx + w / 2), int(cy + h / 2))
                cv2.rectangle(canvas, p1, p2, (0, 255, 0), 1)
                cv2.putText(
                    canvas, self.class_names[int(cls)], p1, cv2.FONT_HERSHEY_SIMPLEX, 0.35, (255, 255, 0), 1
                )
            drawn.append(torch.from_numpy(canvas).permute(2, 0, 1))
        phase = "no_aug" if self.no_aug else "mosaic"
        self.tblogger.add_images(f"train_batch/{phase}", torch.stack(drawn), self.progress_in_iter)

    # ------------------------------------------------------------------ start-up and shutdown
    def _seed(self) -> None:
        if self.exp.seed is None:
            return
        # rank-dependent so that ranks draw different augmentations; DDP broadcasts rank 0's weights anyway
        seed = int(self.exp.seed) + self.rank
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def _install_signal_handlers(self) -> None:
        def on_signal(signum, frame):
            # only a flag: logging or saving here could deadlock on a lock the main thread holds
            if self._stop_signum is not None:
                raise KeyboardInterrupt  # second signal: stop now, without a checkpoint
            self._stop_signum = signum

        self._previous_handlers = {
            sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }

    def _restore_signal_handlers(self) -> None:
        for sig, handler in getattr(self, "_previous_handlers", {}).items():
            signal.signal(sig, handler)

    def _log_summary(self) -> None:
        if self.rank != 0:
            return
        env = [
            ("python", platform.python_version()),
            ("torch", torch.__version__),
            (
                "device",
                torch.cuda.get_device_name(self.device)
                if self.device.type == "cuda"
                else f"cpu x{torch.get_num_threads()} threads",
            ),
            (
                "processes",
                f"{self.world_size} ({dist.get_backend() if self.is_distributed else 'single process'})",
            ),
            ("launcher", launcher_name()),
            ("amp", str(self.amp_dtype).replace("torch.", "") if self.amp_dtype else "off (fp32)"),
            ("batch", f"{self.batch_size} total, {self.batch_size // self.world_size} per process"),
            ("lr", f"{self.exp.basic_lr_per_img * self.batch_size:.4g} ({self.exp.scheduler})"),
            ("iterations", f"{self.max_iter} per epoch x {self.max_epoch} epochs"),
            ("start", f"epoch {self.start_epoch + 1}, iteration {self.start_iter}"),
            (
                "classes",
                f"{len(self.class_names)}: {', '.join(self.class_names[:8])}"
                + (" ..." if len(self.class_names) > 8 else ""),
            ),
            ("cache", self._cache_summary()),
            ("output", self.file_name),
            ("command", " ".join(sys.argv)),
        ]
        # the exp's fields three per row, so that environment and exp fit one screen
        fields = [(k, _short(v)) for k, v in sorted(self.exp.fields().items())]
        rows = [sum(fields[i : i + 3], ()) for i in range(0, len(fields), 3)]
        logger.info(
            "environment\n"
            + tabulate(env, tablefmt="simple", maxcolwidths=[None, 100])
            + "\nexp\n"
            + tabulate(rows, headers=["key", "value"] * 3, tablefmt="simple")
        )

    def _cache_summary(self) -> str:
        """What the image cache really is: asked for and used, asked for and refused, or off."""
        if not self.args.cache:
            return "off"
        cache = getattr(self.train_loader.dataset.dataset, "cache", None)
        if cache is None:
            return f"{self.args.cache} asked for, NOT used (see the warning above): images are read from disk"
        return f"{self.args.cache}: {cache.path} ({cache.nbytes / 2**30:.2f} GiB)"

    def _write_demo_image(self) -> None:
        """The first readable validation image with the final (EMA) model's detections: `demo.jpg`,
        drawn as `tools/demo.py image` draws it by default (score >= DEMO_CONF, NMS across classes).

        A picture, not a result: an unreadable image is passed over, and if none can be read (or the
        drawing fails) the run says so and still ends well.
        """
        dataset = self.evaluator.dataloader.dataset
        for index in range(len(dataset)):
            try:
                image = dataset.load_image(index)
                break
            except (CorruptImageError, FileNotFoundError) as err:
                logger.warning(f"demo image: {err}; trying the next validation image")
        else:
            logger.warning("demo image: no validation image could be read; demo.jpg not written")
            return
        model = self.ema_model.ema if self.ema_model is not None else unwrap_model(self.model)
        predictor = Predictor(
            model,
            self.exp.num_classes,
            self.exp.test_size,
            conf=DEMO_CONF,
            nms=DEMO_NMS,
            device=self.device,
            class_agnostic=True,
        )
        try:
            write_demo_image(predictor, image, self.class_names, os.path.join(self.file_name, "demo.jpg"))
        except Exception as err:  # noqa: BLE001 -- the run is done; a failed picture must not undo it
            logger.warning(f"demo image not written: {type(err).__name__}: {err}")


def run_training(args) -> None:
    """Entry point of every training process (tools/train.py launches it once per rank).

    The exp is rebuilt here from the command line (`core.cli.build_exp`), so spawned workers
    need only the plain-data arguments. A SIGINT/SIGTERM ends the process with code 128 + signal
    after the checkpoint is written: torchrun counts that as a failure and restarts when allowed.
    A second run into an output folder in use exits with code 1 before it writes anything there.
    """
    from yolox_fast.core.cli import build_exp

    exp = build_exp(args)
    # one run per output folder, locked before anything is written there (utils/run_lock.py)
    try:
        lock = claim_output_folder(os.path.join(exp.output_dir, args.experiment_name), args.force_lock)
    except RunLockError as err:
        logger.error(str(err))
        raise SystemExit(1) from None
    try:
        Trainer(exp, args).train()
    except TrainingStopped as stop:
        where = f"checkpoint {stop.path}" if stop.path else "the checkpoint on rank 0"
        logger.warning(f"{stop}: {where} holds the current iteration; continue with --resume")
        raise SystemExit(128 + stop.signum) from None
    finally:
        lock.release()
