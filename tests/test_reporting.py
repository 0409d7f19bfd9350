"""core/reporting.py from values: a RunSetup and a Step, no Trainer, give the progress line, the trackers'
scalars and the run summary's batch line."""

import time

import torch

from yolox_fast.core.reporting import RunSetup, Step, batch_summary, log_extension, log_progress
from yolox_fast.utils.metric import MeterBuffer

# -b 16 on 2 processes, 4 batches a step (nominal 64), resumed at step 4 of epoch 2 (0-based 1)
RUN = RunSetup(
    world_size=2,
    device=torch.device("cpu"),
    batch_size=16,
    accumulate=4,
    amp_dtype=torch.bfloat16,
    max_epoch=3,
    max_iter=10,
    start_epoch=1,
    start_iter=4,
    mosaic_close_epoch=1,
    class_names=("cat", "dog"),
    run_dir="out",
)


class RecordedTrackers:
    """What the trackers were given: (step, scalars) per `log_metrics` call."""

    def __init__(self) -> None:
        self.metrics = []

    def log_metrics(self, metrics, step) -> None:
        self.metrics.append((step, dict(metrics)))


def test_a_run_counts_optimizer_steps_of_the_nominal_batch():
    assert (RUN.step_batch, RUN.start_progress, RUN.progress(2, 3), RUN.amp_name) == (64, 14, 23, "bfloat16")
    assert batch_summary(RUN) == (
        "16 total, 8 per process; 4 batches accumulated per optimizer step = 64 images (nominal_batch_size): "
        "lr, warmup and EMA follow it"
    )


def test_the_progress_line_and_the_trackers_scalars_come_from_the_values(log_lines):
    meter = MeterBuffer(window=10)
    meter.update(iter_time=0.5, data_time=0.1, lr=0.01, total_loss=2.0, iou_loss=1.0, num_fg=3.0)
    recorded = RecordedTrackers()
    log_progress(RUN, Step(1, 8, (320, 416)), meter, recorded, print_interval=10, started=time.perf_counter())
    assert log_lines == [] and recorded.metrics == []  # the 9th step: not a multiple of print_interval
    log_progress(RUN, Step(1, 9, (320, 416)), meter, recorded, print_interval=10, started=time.perf_counter())
    line = log_lines[-1]
    assert line.startswith("epoch: 2/3, iter: 10/10, ") and "size: 320x416, img/s: 128.0, ETA: " in line
    assert "total_loss: 2.000, iou_loss: 1.000, num_fg: 3.000, lr: 1.000e-02" in line
    scalars = {"train/lr": 0.01, "train/total_loss": 2.0, "train/iou_loss": 1.0, "train/num_fg": 3.0}
    assert recorded.metrics == [(20, scalars)]  # the global step, 1-based


def test_an_extended_schedule_is_said_only_when_max_epoch_changed(log_lines):
    log_extension(RUN, 0.005, no_aug_epochs=1, ckpt={"exp": {"max_epoch": 3}})
    assert log_lines == []
    log_extension(RUN, 0.005, no_aug_epochs=1, ckpt={"exp": {"max_epoch": 2}})
    assert log_lines[-1].startswith(
        "max_epoch 2 -> 3: from epoch 2 on the schedule is the 3-epoch run's: lr 0.005"
    )
    assert log_lines[-1].endswith("flat for the last 1), mosaic and mixup off (the no-aug epochs)")
