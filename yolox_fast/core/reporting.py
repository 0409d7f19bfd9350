"""What a training run tells its user, apart from its checkpoints: the start-up summary (environment and exp
fields, one screen), the progress line with ETA and its scalars for the trackers (`core/trackers.py`), a few
augmented training images with their boxes and validation images with their detections for the trackers,
how an extended run's schedule goes on, and `demo.jpg` at the end.

Each function is given values, never the Trainer: `RunSetup` (the run as set up) and `Step` (where it is),
with what else it reports.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from dataclasses import dataclass
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
from yolox_fast.models.losses import LOSS_KEYS
from yolox_fast.utils.metric import MeterBuffer, memory_mb
from yolox_fast.utils.visualize import draw_targets


@dataclass(frozen=True)
class RunSetup:
    """A training run as set up (`Trainer.before_train`): what the summary, the progress line and the
    trackers report about it."""

    world_size: int
    device: torch.device
    batch_size: int  # total over all processes (-b)
    accumulate: int  # batches per optimizer step (nominal_batch_size)
    amp_dtype: torch.dtype | None
    max_epoch: int
    max_iter: int  # optimizer steps per epoch
    start_epoch: int  # 0-based
    start_iter: int  # optimizer steps already done in start_epoch (mid-epoch resume)
    mosaic_close_epoch: int  # 0-based: mosaic and mixup off from here on
    class_names: tuple[str, ...]
    run_dir: str

    @property
    def step_batch(self) -> int:
        """Images per optimizer step: lr, warmup and EMA follow it."""
        return self.batch_size * self.accumulate

    @property
    def start_progress(self) -> int:
        return self.progress(self.start_epoch, self.start_iter)

    def progress(self, epoch: int, it: int) -> int:
        """Optimizer steps done before step `it` of `epoch` (both 0-based)."""
        return epoch * self.max_iter + it

    @property
    def amp_name(self) -> str:
        return str(self.amp_dtype).replace("torch.", "") if self.amp_dtype else "fp32"


@dataclass(frozen=True)
class Step:
    """Where a run is: the (0-based) epoch, the optimizer step in it, the input size (h, w) it trains at."""

    epoch: int
    iter: int
    input_size: tuple[int, int]


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


def batch_summary(run: RunSetup) -> str:
    """The batch as the run takes it: total, per process, and the accumulation to the nominal batch."""
    text = f"{run.batch_size} total, {run.batch_size // run.world_size} per process"
    if run.accumulate > 1:
        text += (
            f"; {run.accumulate} batches accumulated per optimizer step = {run.step_batch} images "
            "(nominal_batch_size): lr, warmup and EMA follow it"
        )
    return text


def log_trainable(model: torch.nn.Module, freeze: str) -> None:
    """The trainable parameter count after freezing (exp.freeze)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info(f"trainable parameters: {trainable:,} of {total:,} (freeze: {freeze})")


def amp_summary(amp_dtype: torch.dtype | None, scaler: torch.amp.GradScaler) -> str:
    """The run summary's precision: the autocast dtype, and for fp16 the loss scaler's state and settings."""
    if amp_dtype is None:
        return "off (fp32)"
    dtype = str(amp_dtype).replace("torch.", "")
    if not scaler.is_enabled():
        return dtype
    return (
        f"{dtype} + loss scaling (scale {scaler.get_scale():g}, doubled after "
        f"{scaler.get_growth_interval()} steps without overflow)"
    )


def log_run_summary(run: RunSetup, exp, scaler: torch.amp.GradScaler, cache: str) -> None:
    """The environment and the exp's fields as two tables (rank 0's), at the start of a run. `cache`: the
    image cache in words (`cache_summary`)."""
    device = run.device
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
            f"{run.world_size} ({dist.get_backend() if run.world_size > 1 else 'single process'})",
        ),
        ("launcher", launcher_name()),
        ("amp", amp_summary(run.amp_dtype, scaler)),
        ("batch", batch_summary(run)),
        ("lr", f"{exp.basic_lr_per_img * run.step_batch:.4g} ({exp.scheduler})"),
        ("iterations", f"{run.max_iter} optimizer steps per epoch x {run.max_epoch} epochs"),
        ("start", f"epoch {run.start_epoch + 1}, iteration {run.start_iter}"),
        (
            "classes",
            f"{len(run.class_names)}: {', '.join(run.class_names[:8])}"
            + (" ..." if len(run.class_names) > 8 else ""),
        ),
        ("cache", cache),
        ("loader", loader_summary(exp)),
        ("output", run.run_dir),
        ("command", " ".join(sys.argv)),
    ]
    if exp.compile:
        env.append(("torch.compile", f"{exp.compile_backend}, mode {exp.compile_mode} (graphs at first use)"))
    if exp.grad_checkpoint:
        env.append(
            ("activation checkpointing", "on (python tools/benchmark.py train --grad-checkpoint measures it)")
        )
    # the exp's fields three per row, so that environment and exp fit one screen
    fields = [(k, _short(v)) for k, v in sorted(exp.fields().items())]
    rows = [sum(fields[i : i + 3], ()) for i in range(0, len(fields), 3)]
    logger.info(
        "environment\n"
        + tabulate(env, tablefmt="simple", maxcolwidths=[None, 100])
        + "\nexp\n"
        + tabulate(rows, headers=["key", "value"] * 3, tablefmt="simple")
    )


def log_progress(
    run: RunSetup,
    step: Step,
    meter: MeterBuffer,
    run_trackers: trackers.Trackers,
    print_interval: int,
    started: float,
) -> None:
    """Every `print_interval` optimizer steps: the progress line (losses, lr, speed, ETA) and the lr and the
    losses for the trackers, at the global step. `started`: the run's start (time.perf_counter)."""
    if (step.iter + 1) % print_interval != 0 or "iter_time" not in meter:
        return
    iter_time = meter["iter_time"].avg
    progress = run.progress(step.epoch, step.iter)
    done = progress + 1 - run.start_progress
    left = run.max_epoch * run.max_iter - progress - 1
    # mean over all iterations of this run, so the ETA does not swing with multi-scale sizes
    eta = (time.perf_counter() - started) / max(1, done) * left
    losses = ", ".join(f"{k}: {meter[k].avg:.3f}" for k in LOSS_KEYS if k in meter)
    logger.info(
        f"epoch: {step.epoch + 1}/{run.max_epoch}, iter: {step.iter + 1}/{run.max_iter}, "
        f"mem: {memory_mb(run.device):.0f}Mb, iter_time: {iter_time:.3f}s, "
        f"data_time: {meter['data_time'].avg:.3f}s, {losses}, lr: {meter['lr'].latest:.3e}, "
        f"size: {step.input_size[0]}x{step.input_size[1]}, "
        f"img/s: {run.step_batch / iter_time:.1f}, ETA: {datetime.timedelta(seconds=int(eta))}"
    )
    scalars = {
        "train/lr": meter["lr"].latest,
        **{f"train/{k}": meter[k].avg for k in LOSS_KEYS if k in meter},
    }
    run_trackers.log_metrics(scalars, progress + 1)


def log_batch_images(
    run: RunSetup,
    step: Step,
    no_aug: bool,
    run_trackers: trackers.Trackers,
    inps: torch.Tensor,
    targets: torch.Tensor,
    count: int = 4,
) -> None:
    """A few training images with their boxes for the trackers: the first step of the run and of the no-aug
    phase (`no_aug`: whether that phase has begun)."""
    if not run_trackers or step.iter != 0:
        return
    if step.epoch != run.start_epoch and step.epoch != run.mosaic_close_epoch:
        return
    drawn = []
    for img, labels in zip(inps[:count].detach().float().cpu(), targets[:count].detach().float().cpu()):
        bgr = np.ascontiguousarray(img.clamp(0, 255).byte().permute(1, 2, 0).numpy())
        drawn.append(np.ascontiguousarray(draw_targets(bgr, labels.numpy(), run.class_names)[..., ::-1]))
    phase = "no_aug" if no_aug else "mosaic"
    run_trackers.log_images(f"train_batch/{phase}", drawn, run.progress(step.epoch, step.iter))


def start_trackers(
    run: RunSetup, args, exp_fields: dict[str, Any], ckpt: dict[str, Any] | None
) -> trackers.Trackers:
    """Rank 0's trackers (-l, in tools/train.py's `args`), started with the exp's fields and the run's
    settings as their config; a resumed run continues the W&B / MLflow runs its checkpoint names
    ("tracker_runs")."""
    names = trackers.parse_logger(args.logger) if isinstance(args.logger, str) else tuple(args.logger)
    group = trackers.build(names, getattr(args, "tracker_options", {}))
    config = {
        **exp_fields,
        "batch_size": run.batch_size,  # -b, which the exp's batch_size is only the default of
        "accumulate": run.accumulate,
        "world_size": run.world_size,
        "amp": run.amp_name,
        "command": " ".join(sys.argv),
    }
    previous = dict((ckpt or {}).get("tracker_runs") or {})
    group.start(
        trackers.RunStart(run.run_dir, args.experiment_name, config, run.start_progress + 1, previous)
    )
    return group


def log_eval_samples(
    run_trackers: trackers.Trackers, evaluator, class_names: tuple[str, ...], epoch: int
) -> None:
    """The first validation images of `evaluator`'s last evaluation, after (1-based) `epoch`, with their
    detections, for the trackers that show them (W&B's wandb-num_eval_images); a picture, so a failure is a
    warning."""
    count = run_trackers.eval_images
    if not count:
        return
    try:
        samples = trackers.eval_samples(evaluator, count)
    except Exception as err:  # noqa: BLE001 -- an unreadable image must not end training
        logger.warning(f"validation images for the trackers not logged: {type(err).__name__}: {err}")
        return
    run_trackers.log_detections(samples, class_names, epoch)


def log_extension(run: RunSetup, lr_at_start: float, no_aug_epochs: int, ckpt: dict[str, Any]) -> None:
    """A resume with another max_epoch than its checkpoint's run (`--resume max_epoch 400` on a 300-epoch
    run): the schedule is the new run's from the resume point on (where its lr is `lr_at_start`), said in
    one line."""
    before = (ckpt.get("exp") or {}).get("max_epoch")
    if before is None or before == run.max_epoch:
        return
    close, start = run.mosaic_close_epoch, run.start_epoch
    mosaic = "off (the no-aug epochs)" if start >= close else f"on until epoch {close}"
    logger.info(
        f"max_epoch {before} -> {run.max_epoch}: from epoch {start + 1} on the schedule is the "
        f"{run.max_epoch}-epoch run's: lr {lr_at_start:.4g} (that curve's value here, warmup and cosine over "
        f"{run.max_epoch} epochs, flat for the last {no_aug_epochs}), mosaic and mixup {mosaic}"
    )


def write_final_demo(run: RunSetup, exp, model: torch.nn.Module, dataset) -> None:
    """The first readable image of the validation `dataset` with `model`'s detections: `demo.jpg` in the
    output folder, drawn as `tools/demo.py image` draws it by default (score >= DEMO_CONF, NMS across
    classes).

    A picture, not a result: an unreadable image is passed over, and if none can be read (or the
    drawing fails) the run says so and still ends well.
    """
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
        exp.num_classes,
        exp.test_size,
        conf=DEMO_CONF,
        nms=DEMO_NMS,
        device=run.device,
        class_agnostic=True,
    )
    try:
        write_demo_image(predictor, image, run.class_names, os.path.join(run.run_dir, "demo.jpg"))
    except Exception as err:  # noqa: BLE001 -- the run is done; a failed picture must not undo it
        logger.warning(f"demo image not written: {type(err).__name__}: {err}")
