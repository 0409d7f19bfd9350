"""Gradient accumulation with a nominal batch (`exp.nominal_batch_size`, Ultralytics' `nbs`).

`-b 16` with `nominal_batch_size 64` runs each optimizer step over 4 batches of 16: the trainer's
"iteration" is then one optimizer step of 64 images, not one batch. Everything counted in iterations counts
optimizer steps: the lr schedule (lr = basic_lr_per_img * 64, its warmup and cosine over steps), the EMA's
updates and its ramp, `print_interval`, the multi-scale redraw every 10 steps, iterations per epoch (the
loader's batches // 4; the few left over at an epoch's end start the next epoch's stream, none is dropped
from it) and the checkpoint's position. Weight decay is applied once per step, to the gradient of the 64
images, as in one step of 64.

The gradient is that of one batch of 64 (tests/test_trainer.py checks it to float32 rounding): YOLOX divides
a batch's loss sums by its foreground count, so each batch's loss is weighted by its own count and the sum
divided by the total count (`Trainer._accumulate_gradients`). BatchNorm is the exception: each batch of 16 is
normalised by its own statistics and folds them into the running statistics, as DDP's ranks do.
"""

from __future__ import annotations


def accumulation_steps(nominal_batch_size: int | None, batch_size: int) -> int:
    """Batches per optimizer step: nominal // batch (1 when `nominal_batch_size` is None or not larger than
    the batch). `batch_size` is the total over all processes (-b). ValueError when it does not divide."""
    if nominal_batch_size is None or nominal_batch_size <= batch_size:
        if nominal_batch_size is not None and nominal_batch_size <= 0:
            raise ValueError(
                f"exp.nominal_batch_size must be a positive batch size, got {nominal_batch_size}"
            )
        return 1
    if nominal_batch_size % batch_size:
        raise ValueError(
            f"exp.nominal_batch_size {nominal_batch_size} is not a multiple of -b {batch_size}: each "
            f"optimizer step accumulates whole batches; use a -b that divides it (e.g. "
            f"{nominal_batch_size // 4}) or nominal_batch_size none"
        )
    return nominal_batch_size // batch_size


def steps_per_epoch(batches: int, accumulate: int, batch_size: int) -> int:
    """Optimizer steps in an epoch of `batches` batches of `batch_size`; ValueError when not even one."""
    if batches < accumulate:
        raise ValueError(
            f"the training set makes {batches} batches of {batch_size} per epoch, fewer than the "
            f"{accumulate} that one optimizer step accumulates (nominal_batch_size): use a smaller nominal "
            "batch or more data"
        )
    return batches // accumulate
