"""What a training run tells its user, apart from its checkpoints: the start-up summary (environment and exp
fields, one screen), the progress line with ETA and its scalars for the trackers (`core/trackers.py`), a few
augmented training images with their boxes and validation images with their detections for the trackers,
how an extended run's schedule goes on, and `demo.jpg` at the end.

Each function reads the Trainer it is given and changes nothing in it (`start_trackers` returns its trackers).
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from loguru import logger
from tabulate import tabulate

from yolox_fast.core import trackers
from yolox_fast.core.demo import DEMO_CONF, DEMO_NMS, write_demo_image
from yolox_fast.core.launch import launcher_name
from yolox_fast.data.build import worker_nice
from yolox_fast.data.datasets.base import CorruptImageError
from yolox_fast.inference import Predictor
from yolox_fast.utils.metric import memory_mb
from yolox_fast.utils.visualize import draw_targets

LOSS_KEYS = ("total_loss", "iou_loss", "l1_loss", "conf_loss", "cls_loss", "num_fg")


def _short(value: Any, width: int = 32) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def cache_summary(cache_asked: str | None, cache) -> str:
    """What the image cache really is: asked for and used (`cache` is the ImageCache), asked for and
    refused (`cache` None), or off."""
    if not cache_asked:
        return "off"
    if cache is None:
        return f"{cache_asked} asked for, NOT used (see the warning above): images are read from disk"
    return f"{cache_asked}: {cache.path} ({cache.nbytes / 2**30:.2f} GiB)"


def loader_summary(exp) -> str:
    """The training loader's workers and their priority."""
    if exp.data_num_workers == 0:
        return "no workers: this process makes the batches"
    nice = worker_nice(exp)
    why = " (below the training threads that share their CPU: data_worker_nice)" if nice else ""
    return f"{exp.data_num_workers} workers at nice {nice:+d}{why}"


def batch_summary(trainer) -> str:
    """The batch as the run takes it: total, per process, and the accumulation to the nominal batch."""
    text = f"{trainer.batch_size} total, {trainer.batch_size // trainer.world_size} per process"
    if trainer.accumulate > 1:
        text += (
            f"; {trainer.accumulate} batches accumulated per optimizer step = {trainer.step_batch} images "
            "(nominal_batch_size): lr, warmup and EMA follow it"
        )
    return text


def log_trainable(model: torch.nn.Module, freeze: str) -> None:
    """The trainable parameter count after freezing (exp.freeze)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info(f"trainable parameters: {trainable:,} of {total:,} (freeze: {freeze})")


def amp_summary(trainer) -> str:
    """The run summary's precision: the autocast dtype, and for fp16 the loss scaler's state and settings."""
    if trainer.amp_dtype is None:
        return "off (fp32)"
    dtype = str(trainer.amp_dtype).replace("torch.", "")
    if not trainer.scaler.is_enabled():
        return dtype
    return (
        f"{dtype} + loss scaling (scale {trainer.scaler.get_scale():g}, doubled after "
        f"{trainer.exp.scaler_growth_interval} steps without overflow)"
    )


def log_run_summary(trainer) -> None:
    """The environment and the exp's fields as two tables, on rank 0, at the start of a run."""
    if trainer.rank != 0:
        return
    device = trainer.device
    env = [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        (
            "device",
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"cpu x{torch.get_num_threads()} threads",
        ),
        (
            "processes",
            f"{trainer.world_size} ({dist.get_backend() if trainer.is_distributed else 'single process'})",
        ),
        ("launcher", launcher_name()),
        ("amp", amp_summary(trainer)),
        ("batch", batch_summary(trainer)),
        ("lr", f"{trainer.exp.basic_lr_per_img * trainer.step_batch:.4g} ({trainer.exp.scheduler})"),
        ("iterations", f"{trainer.max_iter} optimizer steps per epoch x {trainer.max_epoch} epochs"),
        ("start", f"epoch {trainer.start_epoch + 1}, iteration {trainer.start_iter}"),
        (
            "classes",
            f"{len(trainer.class_names)}: {', '.join(trainer.class_names[:8])}"
            + (" ..." if len(trainer.class_names) > 8 else ""),
        ),
        ("cache", cache_summary(trainer.args.cache, trainer.train_loader.images.cache)),
        ("loader", loader_summary(trainer.exp)),
        ("output", trainer.run_dir),
        ("command", " ".join(sys.argv)),
    ]
    if trainer.exp.compile:
        exp = trainer.exp
        env.append(("torch.compile", f"{exp.compile_backend}, mode {exp.compile_mode} (graphs at first use)"))
    if trainer.exp.grad_checkpoint:
        env.append(
            ("activation checkpointing", "on (python tools/benchmark.py train --grad-checkpoint measures it)")
        )
    # the exp's fields three per row, so that environment and exp fit one screen
    fields = [(k, _short(v)) for k, v in sorted(trainer.exp.fields().items())]
    rows = [sum(fields[i : i + 3], ()) for i in range(0, len(fields), 3)]
    logger.info(
        "environment\n"
        + tabulate(env, tablefmt="simple", maxcolwidths=[None, 100])
        + "\nexp\n"
        + tabulate(rows, headers=["key", "value"] * 3, tablefmt="simple")
    )


def log_progress(trainer) -> None:
    """Every exp.print_interval optimizer steps: the progress line (losses, lr, speed, ETA) and the lr and
    the losses for the trackers, at the global step."""
    meter = trainer.meter
    if (trainer.iter + 1) % trainer.exp.print_interval != 0 or "iter_time" not in meter:
        return
    iter_time = meter["iter_time"].avg
    done = trainer.progress_in_iter + 1 - trainer.start_progress
    left = trainer.max_epoch * trainer.max_iter - trainer.progress_in_iter - 1
    # mean over all iterations of this run, so the ETA does not swing with multi-scale sizes
    eta = (time.perf_counter() - trainer.train_start) / max(1, done) * left
    losses = ", ".join(f"{k}: {meter[k].avg:.3f}" for k in LOSS_KEYS if k in meter)
    logger.info(
        f"epoch: {trainer.epoch + 1}/{trainer.max_epoch}, iter: {trainer.iter + 1}/{trainer.max_iter}, "
        f"mem: {memory_mb(trainer.device):.0f}Mb, iter_time: {iter_time:.3f}s, "
        f"data_time: {meter['data_time'].avg:.3f}s, {losses}, lr: {meter['lr'].latest:.3e}, "
        f"size: {trainer.input_size[0]}x{trainer.input_size[1]}, "
        f"img/s: {trainer.step_batch / iter_time:.1f}, ETA: {datetime.timedelta(seconds=int(eta))}"
    )
    scalars = {
        "train/lr": meter["lr"].latest,
        **{f"train/{k}": meter[k].avg for k in LOSS_KEYS if k in meter},
    }
    trainer.trackers.log_metrics(scalars, trainer.progress_in_iter + 1)


def log_batch_images(trainer, inps: torch.Tensor, targets: torch.Tensor, count: int = 4) -> None:
    """A few training images with their boxes for the trackers: the first step of the run and of the no-aug
    phase."""
    if not trainer.trackers or trainer.iter != 0:
        return
    if trainer.epoch != trainer.start_epoch and trainer.epoch != trainer.mosaic_close_epoch:
        return
    drawn = []
    for img, labels in zip(inps[:count].detach().float().cpu(), targets[:count].detach().float().cpu()):
        bgr = np.ascontiguousarray(img.clamp(0, 255).byte().permute(1, 2, 0).numpy())
        drawn.append(np.ascontiguousarray(draw_targets(bgr, labels.numpy(), trainer.class_names)[..., ::-1]))
    phase = "no_aug" if trainer.no_aug else "mosaic"
    trainer.trackers.log_images(f"train_batch/{phase}", drawn, trainer.progress_in_iter)


def start_trackers(trainer, ckpt: dict[str, Any] | None) -> trackers.Trackers:
    """Rank 0's trackers (-l), started with the exp's fields and the run's settings as their config; a
    resumed run continues the W&B / MLflow runs its checkpoint names ("tracker_runs")."""
    args = trainer.args
    names = trackers.parse_logger(args.logger) if isinstance(args.logger, str) else tuple(args.logger)
    group = trackers.build(names, getattr(args, "tracker_options", {}))
    config = {
        **trainer.exp.fields(),
        "batch_size": trainer.batch_size,  # -b, which the exp's batch_size is only the default of
        "accumulate": trainer.accumulate,
        "world_size": trainer.world_size,
        "amp": str(trainer.amp_dtype).replace("torch.", "") if trainer.amp_dtype else "fp32",
        "command": " ".join(sys.argv),
    }
    previous = dict((ckpt or {}).get("tracker_runs") or {})
    group.start(
        trackers.RunStart(trainer.run_dir, args.experiment_name, config, trainer.start_progress + 1, previous)
    )
    return group


def log_eval_samples(trainer) -> None:
    """The first validation images of the last evaluation with their detections, for the trackers that show
    them (W&B's wandb-num_eval_images); a picture, so a failure is a warning."""
    count = trainer.trackers.eval_images
    if not count:
        return
    try:
        samples = trackers.eval_samples(trainer.evaluator, count)
    except Exception as err:  # noqa: BLE001 -- an unreadable image must not end training
        logger.warning(f"validation images for the trackers not logged: {type(err).__name__}: {err}")
        return
    trainer.trackers.log_detections(samples, trainer.class_names, trainer.epoch + 1)


def log_extension(trainer, ckpt: dict[str, Any]) -> None:
    """A resume with another max_epoch than its checkpoint's run (`--resume max_epoch 400` on a 300-epoch
    run): the schedule is the new run's from the resume point on, said in one line."""
    before = (ckpt.get("exp") or {}).get("max_epoch")
    if before is None or before == trainer.max_epoch:
        return
    lr = trainer.lr_scheduler.update_lr(trainer.progress_in_iter_at(trainer.start_epoch, trainer.start_iter))
    close = trainer.mosaic_close_epoch
    mosaic = "off (the no-aug epochs)" if trainer.start_epoch >= close else f"on until epoch {close}"
    logger.info(
        f"max_epoch {before} -> {trainer.max_epoch}: from epoch {trainer.start_epoch + 1} on the schedule is "
        f"the {trainer.max_epoch}-epoch run's: lr {lr:.4g} (that curve's value here, warmup and cosine over "
        f"{trainer.max_epoch} epochs, flat for the last {trainer.exp.no_aug_epochs}), mosaic and mixup "
        f"{mosaic}"
    )


def write_final_demo(trainer, model: torch.nn.Module) -> None:
    """The first readable validation image with `model`'s detections: `demo.jpg` in the output folder,
    drawn as `tools/demo.py image` draws it by default (score >= DEMO_CONF, NMS across classes).

    A picture, not a result: an unreadable image is passed over, and if none can be read (or the
    drawing fails) the run says so and still ends well.
    """
    dataset = trainer.evaluator.dataloader.dataset
    for index in range(len(dataset)):
        try:
            image = dataset.load_image(index)
            break
        except (CorruptImageError, FileNotFoundError) as err:
            logger.warning(f"demo image: {err}; trying the next validation image")
    else:
        logger.warning("demo image: no validation image could be read; demo.jpg not written")
        return
    predictor = Predictor(
        model,
        trainer.exp.num_classes,
        trainer.exp.test_size,
        conf=DEMO_CONF,
        nms=DEMO_NMS,
        device=trainer.device,
        class_agnostic=True,
    )
    try:
        write_demo_image(predictor, image, trainer.class_names, os.path.join(trainer.run_dir, "demo.jpg"))
    except Exception as err:  # noqa: BLE001 -- the run is done; a failed picture must not undo it
        logger.warning(f"demo image not written: {type(err).__name__}: {err}")
