"""What a training run tells its user, apart from its checkpoints: the start-up summary (environment and exp
fields, one screen), the progress line with ETA and its TensorBoard scalars, a few augmented training
images with their boxes in TensorBoard, and `demo.jpg` at the end.

Each function reads the Trainer it is given and changes nothing in it.
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

from yolox_fast.core.demo import DEMO_CONF, DEMO_NMS, write_demo_image
from yolox_fast.core.launch import launcher_name
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
        ("amp", str(trainer.amp_dtype).replace("torch.", "") if trainer.amp_dtype else "off (fp32)"),
        ("batch", f"{trainer.batch_size} total, {trainer.batch_size // trainer.world_size} per process"),
        ("lr", f"{trainer.exp.basic_lr_per_img * trainer.batch_size:.4g} ({trainer.exp.scheduler})"),
        ("iterations", f"{trainer.max_iter} per epoch x {trainer.max_epoch} epochs"),
        ("start", f"epoch {trainer.start_epoch + 1}, iteration {trainer.start_iter}"),
        (
            "classes",
            f"{len(trainer.class_names)}: {', '.join(trainer.class_names[:8])}"
            + (" ..." if len(trainer.class_names) > 8 else ""),
        ),
        ("cache", cache_summary(trainer.args.cache, trainer.train_loader.images.cache)),
        ("output", trainer.run_dir),
        ("command", " ".join(sys.argv)),
    ]
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
    """Every exp.print_interval iterations: the progress line (losses, lr, speed, ETA) and, with
    TensorBoard, the lr and the losses."""
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
        f"img/s: {trainer.batch_size / iter_time:.1f}, ETA: {datetime.timedelta(seconds=int(eta))}"
    )
    if trainer.tblogger is not None:
        step = trainer.progress_in_iter + 1
        trainer.tblogger.add_scalar("train/lr", meter["lr"].latest, step)
        for k in LOSS_KEYS:
            if k in meter:
                trainer.tblogger.add_scalar(f"train/{k}", meter[k].avg, step)


def log_batch_images(trainer, inps: torch.Tensor, targets: torch.Tensor, count: int = 4) -> None:
    """A few training images with their boxes in TensorBoard: the first iteration of the run and of the
    no-aug phase."""
    if trainer.tblogger is None or trainer.iter != 0:
        return
    if trainer.epoch != trainer.start_epoch and trainer.epoch != trainer.mosaic_close_epoch:
        return
    drawn = []
    for img, labels in zip(inps[:count].detach().float().cpu(), targets[:count].detach().float().cpu()):
        bgr = np.ascontiguousarray(img.clamp(0, 255).byte().permute(1, 2, 0).numpy())
        rgb = draw_targets(bgr, labels.numpy(), trainer.class_names)[..., ::-1]
        drawn.append(torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1))
    phase = "no_aug" if trainer.no_aug else "mosaic"
    trainer.tblogger.add_images(f"train_batch/{phase}", torch.stack(drawn), trainer.progress_in_iter)


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
