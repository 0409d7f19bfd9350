"""Trainer: the YOLOX training loop (native AMP, DDP, EMA, multi-scale, gradient accumulation, exact resume,
signal-safe checkpoints). Reading order: `train` -> `before_train` -> per epoch `before_epoch`,
`train_in_epoch` (calls `train_one_iter`, the whole step in one straight line), `after_epoch`; `after_train`.

One step: `data/datasets/*` (decode, resize) -> `data/mosaic.py` -> `data/augment.py` `TrainTransform` ->
`data/loader.py` -> `_next_batch` (to the device, float, channels_last) -> `exp.preprocess` (multi-scale) ->
`models/yolox.py` -> `models/head.py` -> `models/losses.py` -> `models/simota.py` -> backward (over several
batches with a nominal batch, `core/accumulation.py`) -> `core/nonfinite.py` -> SGD step -> `utils/ema.py`.
What the run reports: `core/reporting.py` (summary, progress, demo.jpg), `core/trackers.py` (TensorBoard, W&B,
MLflow), `core/results.py` (results.csv and .png). Saving, resuming, the best score: `core/checkpointer.py`.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from typing import Any

import numpy as np
import torch
from loguru import logger

from yolox_fast.core import reporting, trackers
from yolox_fast.core.accumulation import accumulation_steps, steps_per_epoch
from yolox_fast.core.checkpointer import Checkpointer, Saved, StartOptions, resume_ema
from yolox_fast.core.nonfinite import NonFiniteGuard
from yolox_fast.core.results import EpochResults
from yolox_fast.core.stop_signal import StopSignal, TrainingStopped
from yolox_fast.evaluators.report import record_training_eval
from yolox_fast.models.folded_bn import has_folded_bn, refit_finetune_weights
from yolox_fast.models.losses import LOSS_KEYS
from yolox_fast.utils import dist as dist_utils
from yolox_fast.utils.amp import amp_dtype, autocast, loss_scaler
from yolox_fast.utils.compile import compile_for_training, compile_stats
from yolox_fast.utils.ema import ModelEMA, unwrap_model
from yolox_fast.utils.logger import setup_logger
from yolox_fast.utils.metric import MeterBuffer
from yolox_fast.utils.run_lock import RunLockError, claim_output_folder

MULTISCALE_EVERY = 10  # iterations between two draws of the multi-scale input size


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
        self.world_size = dist_utils.get_world_size()
        self.is_distributed = self.world_size > 1
        if args.batch_size % self.world_size:
            raise ValueError(
                f"-b {args.batch_size} must be a multiple of the number of processes ({self.world_size})"
            )
        self.batch_size = args.batch_size
        self.accumulate = accumulation_steps(exp.nominal_batch_size, args.batch_size)  # batches per step
        self.step_batch = self.batch_size * self.accumulate  # images per optimizer step: lr, warmup, EMA
        self.device = dist_utils.local_device()
        self.run_dir = os.path.join(exp.output_dir, args.experiment_name)
        setup_logger(self.run_dir, distributed_rank=self.rank, filename="train_log.txt", mode="a")

        self.amp_dtype = amp_dtype(self.device, fp16=args.fp16, bf16=args.bf16, cpu_dtype=exp.cpu_amp_dtype)
        self.scaler = loss_scaler(
            self.device, self.amp_dtype, exp.scaler_init_scale, exp.scaler_growth_interval
        )

        self.input_size = tuple(exp.input_size)
        # saving, where the run starts, and the best of exp.best_metric (what best_ckpt.pth keeps)
        best_metric, start = getattr(exp, "best_metric", "AP50_95"), StartOptions.from_args(args)
        self.checkpointer = Checkpointer(self.run_dir, best_metric, start, self.rank, self.device)
        self.stopped_early = False
        self.start_epoch = 0
        self.start_iter = 0  # iterations already done inside start_epoch (mid-epoch resume)
        self.epoch = 0
        self.iter = 0
        self.no_aug = False
        self.meter = MeterBuffer(window=exp.print_interval)
        self.trackers = trackers.Trackers()  # rank 0's TensorBoard / W&B / MLflow (-l)
        self.ema_model: ModelEMA | None = None
        self.stop_signal = StopSignal()

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
        except Exception as err:
            stopped = isinstance(err, TrainingStopped) or self.stop_signal.signum is not None
            self.trackers.finish("KILLED" if stopped else "FAILED")  # KILLED: a resume continues the runs
            if not stopped or isinstance(err, TrainingStopped):
                raise
            # a signal made the data loader or a collective fail before the step finished: the weights are
            # those of the last finished step (a step cut short gives back its BN statistics), saved so
            if self._in_step:
                self.guard.restore_bn()
            saved = self.checkpointer.save_interrupted(self.epoch)
            raise TrainingStopped(self.stop_signal.signum, saved) from None
        finally:
            self.stop_signal.restore()
        self.after_train()

    def train_in_epoch(self) -> None:
        first = self.start_iter if self.epoch == self.start_epoch else 0
        for it in range(first, self.max_iter):
            self.iter = it
            stop = self.train_one_iter()
            if stop:
                saved = self.checkpointer.save_interrupted(self.epoch)
                raise TrainingStopped(self.stop_signal.signum or signal.SIGTERM, saved)

    def train_one_iter(self) -> bool:
        """One optimizer step (over `accumulate` batches); returns True when every rank agreed to stop after
        it (signal). A signal during an accumulation takes effect once its step is done."""
        t0 = time.perf_counter()
        lr = self._set_lr(self.progress_in_iter)
        self.guard.snapshot_bn()
        self._in_step = True
        self.optimizer.zero_grad(set_to_none=True)
        outputs, data_time = self._accumulate_gradients()
        self._check_damaged_images()  # what the workers skipped for these batches may stop the run
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)  # once per step: true gradients for the check and the clip

        bad_loss, bad_grads, stop = self.guard.check_step(
            outputs["total_loss"], self.stop_signal.signum is not None
        )
        skip = bad_loss or bad_grads
        losses = {k: float(outputs[k]) for k in LOSS_KEYS if k in outputs}
        if skip:
            self.guard.skip_step(losses, bad_loss, self.epoch, self.iter)
        else:
            self.guard.step_ok()
            if self.exp.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(self.guard.params, self.exp.clip_grad_norm)
            self.scaler.step(self.optimizer)
            if self.ema_model is not None:
                self.ema_model.update(self.model)
        self.scaler.update()  # fp16: an overflow lowers the loss scale
        self.checkpointer.finished, self._in_step = (self.epoch, self.iter + 1), False

        if (self.progress_in_iter + 1) % MULTISCALE_EVERY == 0:
            self.input_size = tuple(
                self.exp.random_resize(self.train_loader, self.epoch, self.rank, self.is_distributed)
            )
        if not skip:
            self.meter.update(iter_time=time.perf_counter() - t0, data_time=data_time, lr=lr, **losses)
            self.results.add_step(losses)
        step = reporting.Step(self.epoch, self.iter, self.input_size)
        reporting.log_progress(
            self.run, step, self.meter, self.trackers, self.exp.print_interval, self.train_start
        )
        return stop

    def _accumulate_gradients(self) -> tuple[dict[str, Any], float]:
        """Forward and backward `accumulate` batches into the gradient of one batch of all their images
        (BatchNorm aside). YOLOX divides a batch's loss sums by its foreground count ("fg_count"): each
        batch's loss is weighted by its count, the sum divided by the total count. Returns the losses of all
        the images together and the time spent waiting for data."""
        sums: dict[str, Any] = {}
        counts, data_time = [], 0.0
        for micro in range(self.accumulate):
            t0 = time.perf_counter()
            inps, targets = self.exp.preprocess(*self._next_batch(), self.input_size)
            data_time += time.perf_counter() - t0
            if micro == 0 and self.trackers:
                step = reporting.Step(self.epoch, self.iter, self.input_size)
                reporting.log_batch_images(self.run, step, self.no_aug, self.trackers, inps, targets)
            # under DDP the gradients are all-reduced once, in the backward of the last batch
            sync = not self.is_distributed or micro == self.accumulate - 1
            with contextlib.nullcontext() if sync else self.model.no_sync():
                with autocast(self.device, self.amp_dtype):
                    outputs = self.model(inps, targets)
                counts.append(torch.as_tensor(outputs.get("fg_count", 1.0), device=self.device).detach())
                weight = counts[-1].clamp(min=1.0) / counts[0].clamp(min=1.0)  # relative: usual magnitudes
                self.scaler.scale(outputs["total_loss"] * weight).backward()
            for k in (k for k in LOSS_KEYS if k in outputs):  # num_fg, a per-GT figure: averaged
                value = torch.as_tensor(outputs[k]).detach()
                sums[k] = sums.get(k, 0.0) + (value if k == "num_fg" else value * weight)
        scale = counts[0].clamp(min=1.0) / torch.stack(counts).sum().clamp(min=1.0)  # 1 for one batch
        if self.accumulate > 1:
            torch._foreach_mul_([p.grad for p in self.guard.params if p.grad is not None], scale)
        return {k: v / self.accumulate if k == "num_fg" else v * scale for k, v in sums.items()}, data_time

    # ------------------------------------------------------------------ phases
    def before_train(self) -> None:
        if self.exp.seed is not None:
            # rank-dependent: ranks draw different augmentations; DDP broadcasts rank 0's weights anyway
            for set_seed in (random.seed, np.random.seed, torch.manual_seed):
                set_seed(int(self.exp.seed) + self.rank)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        model = self.exp.get_model().to(self.device)
        self.memory_format = torch.channels_last if self.exp.channels_last else torch.contiguous_format
        model.to(memory_format=self.memory_format)
        self.optimizer = self.exp.get_optimizer(self.step_batch)
        start = self.checkpointer.start(model, self.optimizer, self.scaler, self.max_epoch, self.amp_dtype)
        self.start_epoch, self.start_iter, ckpt = start.epoch, start.iter, start.ckpt

        self.no_aug = self.start_epoch >= self.mosaic_close_epoch
        self.exp.prepare_dataset()
        self.train_loader = self.exp.get_data_loader(
            batch_size=self.batch_size // self.world_size,
            is_distributed=self.is_distributed,
            no_aug=self.no_aug,
            cache_img=self.args.cache,
        )
        self.class_names = tuple(self.train_loader.images.class_names)
        # images found damaged so far (cache build, unreadable headers) may stop the run before its first step
        self.max_damaged = None if self.exp.skip_corrupt_images else self.exp.max_corrupt_fraction
        self._check_damaged_images()
        if start.finetune_from and self.exp.refit_folded_bn and has_folded_bn(model):
            refit_finetune_weights(
                model, self.train_loader.images, self.device, self.memory_format, start.finetune_from
            )
        if self.exp.freeze != "none":
            model.freeze(self.exp.freeze)
        reporting.log_trainable(model, self.exp.freeze)
        self.max_iter = steps_per_epoch(len(self.train_loader), self.accumulate, self.batch_size)
        self.run = reporting.RunSetup(
            self.world_size,
            self.device,
            self.batch_size,
            self.accumulate,
            self.amp_dtype,
            self.max_epoch,
            self.max_iter,
            self.start_epoch,
            self.start_iter,
            self.mosaic_close_epoch,
            self.class_names,
            self.run_dir,
        )
        self.start_progress = self.run.start_progress
        # a resumed run continues the batch stream where it stopped (the same batches, given exp.seed)
        self.train_loader.skip_to(self.start_progress * self.accumulate)
        self._in_step = False
        self.batches = iter(self.train_loader)  # endless: the loader restarts itself
        self.lr_scheduler = self.exp.get_lr_scheduler(
            self.exp.basic_lr_per_img * self.step_batch, self.max_iter
        )
        if ckpt is not None:
            lr = self.lr_scheduler.update_lr(self.start_progress)
            reporting.log_extension(self.run, lr, self.exp.no_aug_epochs, ckpt)
        if self.no_aug:
            model.enable_l1_loss()

        if self.exp.ema:
            self.ema_model = ModelEMA(model, 0.9998, ramp=self.exp.ema_ramp)
            if ckpt is not None:
                resume_ema(self.ema_model, ckpt, self.start_progress)
        if self.exp.compile:
            ema = [self.ema_model.ema] if self.ema_model is not None else []
            sizes = len(self.exp.multiscale_factors())
            compile_for_training([model, *ema], self.exp.compile_mode, self.exp.compile_backend, sizes)
        if self.is_distributed:
            model = dist_utils.wrap_ddp(model, self.device)
        self.model = model
        self.model.train()
        model = unwrap_model(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.guard = NonFiniteGuard(model, params, self.scaler, self.is_distributed, self.run_dir)
        self.checkpointer.saved = Saved(
            model, self.optimizer, self.scaler, self.ema_model, self.guard, self._run_info
        )
        self.evaluator = self.exp.get_evaluator(
            batch_size=self.batch_size // self.world_size, is_distributed=self.is_distributed
        )
        self.results = EpochResults(self.run_dir, self.start_epoch, enabled=self.rank == 0)
        self.stop_signal.install()
        if self.rank == 0:  # the trackers last: a run that fails to start opens no tracker run
            cache = reporting.cache_summary(self.args.cache, self.train_loader.images.cache)
            reporting.log_run_summary(self.run, self.exp, self.scaler, cache)
            self.trackers = reporting.start_trackers(self.run, self.args, self.exp.fields(), ckpt)
        self.train_start = time.perf_counter()

    def before_epoch(self) -> None:
        logger.info(f"---> start epoch {self.epoch + 1}/{self.max_epoch}")
        self.epoch_start = time.perf_counter()
        if self.epoch >= self.mosaic_close_epoch and not self.no_aug:
            # from here on un-augmented images, the L1 box loss, and an eval every epoch
            logger.info("---> mosaic and mixup off, L1 loss on, eval every epoch from now on")
            self.train_loader.close_mosaic()
            unwrap_model(self.model).enable_l1_loss()
            self.no_aug = True
            self.checkpointer.save("last_mosaic_epoch", start_epoch=self.epoch, it=0, epoch=self.epoch)

    def after_epoch(self) -> None:
        done = self.epoch + 1
        self.checkpointer.save_epoch(done, history=self.exp.save_history_ckpt)
        self._check_damaged_images(every_rank=True)
        damaged = self.train_loader.images.damaged.summary()
        logger.info(f"epoch {done}/{self.max_epoch} finished" + (f"; {damaged}" if damaged else ""))
        if self.exp.compile:
            logger.info(f"torch.compile so far: {compile_stats()}")
        improved, ap = False, None
        if done % self.exp.eval_interval == 0 or self.no_aug or done == self.max_epoch:
            improved, ap = self.evaluate_and_save_model(), self.last_eval
            patience = self.exp.patience if done < self.max_epoch else 0
            self.stopped_early = self.checkpointer.best.count(improved, patience, done)
            # latest also records the new best and the count towards patience: a resumed run goes on from them
            self.checkpointer.save("latest", start_epoch=done, it=0, epoch=self.epoch)
        lr = self.optimizer.param_groups[0]["lr"]
        self.results.end_epoch(done, lr, ap, time.perf_counter() - self.epoch_start)
        self.trackers.log_artifact(os.path.join(self.run_dir, "latest_ckpt.pth"), done, improved)

    def after_train(self) -> None:
        minutes = (time.perf_counter() - self.train_start) / 60
        best = self.checkpointer.best
        logger.info(f"training done in {minutes:.1f} min; best {best.label} {best.score:.4f}")
        if self.rank == 0:
            model = self.ema_model.ema if self.ema_model is not None else unwrap_model(self.model)
            reporting.write_final_demo(self.run, self.exp, model, self.evaluator.dataloader.dataset)
        self.trackers.finish("FINISHED")
        dist_utils.synchronize()

    # ------------------------------------------------------------------ evaluation
    def evaluate_and_save_model(self) -> bool:
        """Evaluate the EMA model; save best_ckpt.pth when exp.best_metric improves, write the eval
        report (tables, pictures). Returns whether it improved; `last_eval` holds (AP50:95, AP50)."""
        eval_model = self.ema_model.ema if self.ema_model is not None else unwrap_model(self.model)
        if self.is_distributed:
            dist_utils.average_bn_stats(eval_model)
        t0 = time.perf_counter()
        ap50_95, ap50, summary = self.exp.eval(eval_model, self.evaluator, self.is_distributed)
        self.model.train()
        # the evaluator returns the same numbers on every rank; broadcast anyway so that the
        # "best" decision, and with it every rank's control flow, cannot diverge
        ap50_95, ap50 = self.last_eval = dist_utils.broadcast_object((float(ap50_95), float(ap50)))
        best = self.checkpointer.best
        improved = best.record(ap50_95, ap50, self.epoch + 1)
        logger.info(
            f"eval epoch {self.epoch + 1}: AP50:95 {ap50_95:.4f}  AP50 {ap50:.4f}  "
            f"(best {best.label} {best.score:.4f}, {time.perf_counter() - t0:.1f} s)\n{summary}"
        )
        self.trackers.log_metrics({"val/AP50_95": ap50_95, "val/AP50": ap50}, self.epoch + 1)
        if improved:
            self.checkpointer.save("best", start_epoch=self.epoch + 1, it=0, epoch=self.epoch)
        # rank 0 (the one that scored) writes eval/ and, when improved, best_eval/; never raises
        record_training_eval(self.evaluator, self.exp, self.run_dir, self.trackers, self.epoch + 1, improved)
        reporting.log_eval_samples(self.trackers, self.evaluator, self.class_names, self.epoch + 1)
        dist_utils.synchronize()
        return improved

    @property
    def mosaic_close_epoch(self) -> int:
        """The (0-based) epoch from which mosaic and mixup are off and L1 is on. As YOLOX 0.3.0's trainer
        (`epoch + 1 == max_epoch - no_aug_epochs`): one epoch before the lr's flat tail, so no_aug_epochs + 1
        epochs train without mosaic (the last one too when no_aug_epochs is 0): one recipe trains alike."""
        return max(0, self.max_epoch - self.exp.no_aug_epochs - 1)

    # ------------------------------------------------------------------ positions and checkpoint entries
    @property
    def progress_in_iter(self) -> int:
        return self.run.progress(self.epoch, self.iter)

    def _run_info(self) -> dict[str, Any]:
        """A checkpoint's plain-data entries about the run."""
        return {
            "class_names": list(self.class_names),
            "exp": self.exp.fields(),
            "tracker_runs": self.trackers.run_ids(),  # the W&B / MLflow runs a resume continues
        }

    # ------------------------------------------------------------------ step helpers
    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch on the device: images uint8 from the loader, float32 0-255 from here on."""
        try:
            imgs, targets = next(self.batches)[:2]
        except Exception:
            # a worker that found no decodable image left: the damaged images' count says why, in one line
            self._check_damaged_images()
            raise
        nb = self.device.type == "cuda"  # non-blocking copies from pinned memory
        imgs = imgs.to(self.device, non_blocking=nb).float().contiguous(memory_format=self.memory_format)
        return imgs, targets.to(self.device, non_blocking=nb)

    def _check_damaged_images(self, every_rank: bool = False) -> None:
        """Stop (TooManyDamagedImages, one line) when more of the training split is damaged than
        exp.max_corrupt_fraction allows. Under DDP the ranks first pool what their workers found
        (`every_rank`, once an epoch), so that all of them take the same decision."""
        damaged = self.train_loader.images.damaged
        if self.is_distributed:
            if not every_rank:
                return
            pooled = damaged.flags.to(self.device)
            torch.distributed.all_reduce(pooled, op=torch.distributed.ReduceOp.MAX)
            damaged.flags.copy_(pooled.cpu())
        damaged.check(self.max_damaged)

    def _set_lr(self, progress: int) -> float:
        lr = self.lr_scheduler.update_lr(progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr


def run_training(args, exp=None) -> None:
    """Entry point of every training process (tools/train.py launches it once per rank).

    The exp is rebuilt here from the command line (`core.cli.build_exp`), so spawned workers
    need only the plain-data arguments (`exp`, an exp object in place of -f/-n, is for one process: the Python
    API's). A SIGINT/SIGTERM ends the process with code 128 + signal
    after the checkpoint is written: torchrun counts that as a failure and restarts when allowed.
    A second run into an output folder in use exits with code 1 before it writes anything there.
    """
    from yolox_fast.core.cli import build_exp

    exp = build_exp(args, exp=exp)
    # one run per output folder, locked before anything is written there (utils/run_lock.py)
    try:
        lock = claim_output_folder(os.path.join(exp.output_dir, args.experiment_name), args.force_lock)
    except RunLockError as err:
        logger.error(str(err))
        raise SystemExit(1) from None
    exit_code = None
    try:
        Trainer(exp, args).train()
    except TrainingStopped as stop:
        where = f"checkpoint {stop.path}" if stop.path else "the checkpoint on rank 0"
        logger.warning(f"{stop}: {where} holds the current iteration; continue with --resume")
        exit_code = 128 + stop.signum
    finally:
        lock.release()
    if exit_code is not None:
        # raised here, not in the except clause: there the exit would carry the stop's traceback as its
        # context, and with it the trainer and its DDP model, alive until the interpreter finalizes
        raise SystemExit(exit_code)
