"""(b) lr at every optimizer step, (c) EMA decay at every update, (d) when mosaic closes, L1 starts and
evaluation runs: official YOLOX 0.3.0's Trainer vs yolox_fast's Trainer, both driven for real.

Both trainers run their own epoch/iteration code (official: `before_epoch`, `train_in_iter` with its
`train_one_iter` and `after_iter`, `after_epoch`, `resume_train`; yolox_fast: `before_train`, `before_epoch`,
`train_in_epoch`, `after_epoch`) around the same tiny model (a 1x1 conv + BN, its loss the mean square
of its output) and a loader stand-in that counts batches and records close_mosaic. Official's
`before_train` is CUDA-only, so its lines are repeated here in its order minus the CUDA calls; its
evaluation is replaced by a recorder (it is what is compared, not what it computes). An optimizer step
pre-hook records what each step uses.

Runs: uninterrupted; stopped after epoch `resume_after` and resumed (both); yolox_fast also stopped in
the middle of an epoch (SIGINT flag) and resumed.

Also, with the real loaders (official: its DataLoader + YoloBatchSampler + InfiniteSampler, one iterator
for the run as its DataPrefetcher keeps; yolox_fast: TrainLoader), 2 workers each: how many batches
after close_mosaic still come with mosaic on (the ones already prefetched).

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/schedule.py
"""

from __future__ import annotations

import argparse
import signal
import tempfile
from pathlib import Path

import common
import numpy as np
import torch
from torch import nn

CONFIGS = (
    # 3 epochs x 5 iterations, warmup 1, no_aug 1: the brief's small run
    {
        "max_epoch": 3,
        "iters": 5,
        "warmup_epochs": 1,
        "no_aug_epochs": 1,
        "eval_interval": 10,
        "resume_after": 1,
    },
    # the proportions, shrunk: no_aug 2 of 6 epochs, eval every 2
    {
        "max_epoch": 6,
        "iters": 4,
        "warmup_epochs": 1,
        "no_aug_epochs": 2,
        "eval_interval": 2,
        "resume_after": 3,
    },
)
BATCH = 16
BASIC_LR_PER_IMG = 0.05 / 64
SIZE = (32, 32)  # the smallest size multi-scale code (units of 32 px) maps to itself


class TinyNet(nn.Module):
    """A 1x1 conv + BN with a `head.use_l1` switch (`enable_l1_loss`); forward returns a YOLOX loss dict."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Module()
        self.head.use_l1 = False  # official's trainer sets it
        self.stop_at_forward = None  # (count, callback): call back at that forward (mid-epoch stop)
        self.forwards = 0

    def enable_l1_loss(self) -> None:  # yolox_fast's trainer calls it
        self.head.use_l1 = True

    def forward(self, x, targets=None):
        self.forwards += 1
        if self.stop_at_forward and self.forwards == self.stop_at_forward[0]:
            self.stop_at_forward[1]()
        loss = self.bn(self.conv(x)).square().mean()
        zero = torch.zeros(())
        return {
            "total_loss": loss,
            "iou_loss": loss,
            "l1_loss": zero,
            "conf_loss": zero,
            "cls_loss": zero,
            "num_fg": 1.0,
        }


class FakeLoader:
    """Endless constant batches; len() iterations per epoch; records close_mosaic."""

    def __init__(self, iters: int, mosaic: bool, events: list) -> None:
        self.iters = iters
        self.mosaic = mosaic
        self.events = events
        self.dataset = argparse.Namespace(class_names=("a",))
        from yolox_fast.data.datasets.damaged import DamagedImages

        # the trainer checks its training images' damaged count after every step: none here
        damaged = DamagedImages("constant batch {}".format, BATCH, "constant batches")
        self.images = argparse.Namespace(class_names=("a",), cache=None, damaged=damaged)
        gen = torch.Generator().manual_seed(1)
        self.batch = (torch.rand(BATCH, 3, *SIZE, generator=gen) * 255, torch.zeros(BATCH, 120, 5))

    def __len__(self) -> int:
        return self.iters

    def __iter__(self):
        while True:
            yield self.batch[0].clone(), self.batch[1].clone(), [], []

    def skip_to(self, batches: int) -> None:
        pass

    def close_mosaic(self) -> None:
        self.mosaic = False
        self.events.append("close_mosaic")


class Recorder:
    """What every optimizer step used, and which epoch-level events happened when."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.events: list = []
        self.epoch = None

    def attach(self, optimizer, model, loader, ema) -> None:
        def hook(opt, args, kwargs):
            updates = ema().updates
            self.steps.append(
                {
                    "lr": [g["lr"] for g in opt.param_groups],
                    "mosaic": loader().mosaic,
                    "use_l1": bool(model().head.use_l1),
                    "ema_updates_before": updates,
                    "ema_decay_of_update": ema().decay(updates + 1),
                }
            )

        optimizer.register_step_pre_hook(hook)


def official_run(cfg: dict, out: Path, rec: Recorder, resume: bool, epochs: range | None = None):
    """Official's Trainer over `epochs` (default: its own train_in_epoch over all); returns the trainer."""
    from yolox.core import Trainer
    from yolox.exp import Exp
    from yolox.utils import ModelEMA

    class TinyExp(Exp):
        def get_model(self):
            if getattr(self, "model", None) is None:
                self.model = TinyNet()
            return self.model

        def get_data_loader(self, batch_size, is_distributed, no_aug=False, cache_img=False):
            return FakeLoader(cfg["iters"], not no_aug, rec.events)

        def random_resize(self, data_loader, epoch, rank, is_distributed):
            return self.input_size  # official's draws on CUDA; multi-scale is off in these runs

    exp = TinyExp()
    exp.max_epoch, exp.warmup_epochs, exp.no_aug_epochs = (
        cfg["max_epoch"],
        cfg["warmup_epochs"],
        cfg["no_aug_epochs"],
    )
    exp.eval_interval, exp.basic_lr_per_img, exp.input_size = cfg["eval_interval"], BASIC_LR_PER_IMG, SIZE
    exp.print_interval, exp.output_dir = 10**6, str(out)
    args = argparse.Namespace(
        batch_size=BATCH,
        fp16=False,
        experiment_name="official",
        resume=resume,
        ckpt=None,
        start_epoch=None,
        cache=False,
        logger="tensorboard",
        occupy=False,
    )
    t = Trainer(exp, args)
    common.quiet_loguru()  # its setup_logger sent stdout into loguru
    t.device = "cpu"
    # official before_train, in its order, without torch.cuda.set_device / occupy_mem / model summary
    model = exp.get_model()
    t.optimizer = exp.get_optimizer(args.batch_size)
    model = t.resume_train(model)
    t.no_aug = t.start_epoch >= t.max_epoch - exp.no_aug_epochs
    t.train_loader = exp.get_data_loader(args.batch_size, False, no_aug=t.no_aug)
    batches = iter(t.train_loader)
    t.prefetcher = argparse.Namespace(next=lambda: next(batches)[:2])
    t.max_iter = len(t.train_loader)
    t.lr_scheduler = exp.get_lr_scheduler(exp.basic_lr_per_img * args.batch_size, t.max_iter)
    t.ema_model = ModelEMA(model, 0.9998)
    t.ema_model.updates = t.max_iter * t.start_epoch
    t.model = model
    t.evaluate_and_save_model = lambda: rec.events.append(("eval", t.epoch + 1))
    t.tblogger = None
    rec.attach(t.optimizer, lambda: t.model, lambda: t.train_loader, lambda: t.ema_model)
    if epochs is None:
        t.train_in_epoch()
    else:
        for t.epoch in epochs:  # official's train_in_epoch, over part of the run
            t.before_epoch()
            t.train_in_iter()
            t.after_epoch()
    return t


def ours_run(cfg: dict, out: Path, rec: Recorder, resume: bool, epochs: range | None = None, stop_at=None):
    """yolox_fast's Trainer; `stop_at`: global step after which a SIGINT flag stops it (mid-epoch)."""
    from yolox_fast.core.trainer import Trainer, TrainingStopped
    from yolox_fast.exp import Exp

    class TinyExp(Exp):
        def get_model(self):
            if getattr(self, "model", None) is None:
                self.model = TinyNet()
            return self.model

        def prepare_dataset(self):
            pass

        def get_data_loader(self, batch_size, is_distributed, no_aug=False, cache_img=None):
            return FakeLoader(cfg["iters"], not no_aug, rec.events)

        def get_evaluator(self, batch_size, is_distributed):
            return None

        def eval(self, model, evaluator, is_distributed, half=False):
            rec.events.append(("eval", trainer.epoch + 1))
            return 0.0, 0.0, ""

    exp = TinyExp()
    exp.max_epoch, exp.warmup_epochs, exp.no_aug_epochs = (
        cfg["max_epoch"],
        cfg["warmup_epochs"],
        cfg["no_aug_epochs"],
    )
    exp.eval_interval, exp.basic_lr_per_img, exp.input_size = cfg["eval_interval"], BASIC_LR_PER_IMG, SIZE
    exp.print_interval, exp.output_dir, exp.multiscale_range = 10**6, str(out), 0
    args = argparse.Namespace(
        batch_size=BATCH,
        experiment_name="ours",
        fp16=False,
        bf16=False,
        resume=resume,
        ckpt=None,
        auto_resume=False,
        start_epoch=None,
        cache=None,
        logger="none",
    )
    exp.save_history_ckpt = False
    exp.channels_last = False  # the same conv kernels as official: only the schedule differs
    trainer = Trainer(exp, args)
    common.quiet_loguru()  # its setup_logger added console and file sinks
    trainer.before_train()
    # results.csv and its plot (redrawn each epoch, about 0.4 s, half of this section's time) are not what
    # is compared here; test_results.py has them
    trainer.results.enabled = False
    rec.attach(
        trainer.optimizer, lambda: trainer.model, lambda: trainer.train_loader, lambda: trainer.ema_model
    )
    if stop_at is not None:
        trainer.model.stop_at_forward = (
            stop_at,
            lambda: setattr(trainer.stop_signal, "signum", signal.SIGINT),
        )
    try:
        for epoch in epochs if epochs is not None else range(trainer.start_epoch, trainer.max_epoch):
            trainer.epoch = epoch  # yolox_fast's Trainer.train, without after_train (demo image)
            trainer.before_epoch()
            trainer.train_in_epoch()
            trainer.after_epoch()
    except TrainingStopped:
        rec.events.append(("stopped_after_step", len(rec.steps)))
    finally:
        trainer.stop_signal.restore()
    return trainer


def weights(model) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().clone().double() for k, v in model.state_dict().items() if v.dtype.is_floating_point
    }


def max_diff(a: dict, b: dict) -> float:
    """Largest per-tensor max |a - b| / max |a| over the floating-point tensors of two state dicts."""
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-30)) for k in a)


def summary(rec: Recorder) -> dict:
    return {"steps": rec.steps, "events": rec.events}


class FlagDataset(torch.utils.data.Dataset):
    """Items report whether they were asked for with mosaic on (official's and ours' item formats)."""

    def __init__(self, official: bool) -> None:
        self.official = official
        self.enable_mosaic = True

    def __len__(self) -> int:
        return 64

    def __getitem__(self, item):
        if isinstance(item, int):
            return torch.tensor(float(self.enable_mosaic))
        if self.official:  # (mosaic, index)
            return torch.tensor(float(item[0]))
        # (mosaic, index, seed words); ours' collate takes (image, labels, info, id)
        return np.full((3, 1, 1), float(item[0]), np.float32), np.zeros((0, 5), np.float32), (1, 1), 0


def batches_with_mosaic_after_close(
    workers: int = 2, batch: int = 4, before: int = 5, after: int = 12
) -> dict:
    """Consume `before` batches, close mosaic, then count mosaic batches among the next `after`."""
    from yolox.data import DataLoader as OfficialLoader
    from yolox.data import InfiniteSampler as OfficialSampler
    from yolox.data import YoloBatchSampler as OfficialBatchSampler

    from yolox_fast.data.loader import TrainLoader
    from yolox_fast.data.sampler import InfiniteSampler, YoloBatchSampler

    official = OfficialLoader(
        FlagDataset(official=True),
        batch_sampler=OfficialBatchSampler(OfficialSampler(64, seed=0), batch, drop_last=False, mosaic=True),
        num_workers=workers,
    )
    ours = TrainLoader(
        FlagDataset(official=False),
        YoloBatchSampler(InfiniteSampler(64, seed=0, rank=0, world_size=1), batch, mosaic=True),
        num_workers=workers,
        max_labels=1,
        pin_memory=False,
    )
    result = {}
    for name, loader, unpack in (("official", official, lambda b: b), ("ours", ours, lambda b: b[0])):
        stream = iter(loader)
        for _ in range(before):
            next(stream)
        loader.close_mosaic()
        result[name] = [bool(unpack(next(stream)).bool().any()) for _ in range(after)]
    return {"workers": workers, "mosaic_batches_after_close": {k: sum(v) for k, v in result.items()}}


def run_config(cfg: dict, tmp: Path) -> dict:
    from yolox.utils import LRScheduler

    result = {"config": cfg}
    rec = Recorder()
    off = official_run(cfg, tmp / "a", rec, resume=False)
    result["official"] = summary(rec)
    rec = Recorder()
    ours = ours_run(cfg, tmp / "b", rec, resume=False)
    result["ours"] = summary(rec)
    result["final_raw_max_rel_diff"] = max_diff(weights(off.model), weights(ours.model))
    result["final_ema_max_rel_diff"] = max_diff(weights(off.ema_model.ema), weights(ours.ema_model.ema))

    split = cfg["resume_after"]
    rec = Recorder()
    official_run(cfg, tmp / "c", rec, resume=False, epochs=range(split))
    off_resumed = official_run(cfg, tmp / "c", rec, resume=True)
    result["official_resumed"] = summary(rec)
    result["official_resumed_raw_vs_uninterrupted"] = max_diff(weights(off_resumed.model), weights(off.model))

    rec = Recorder()
    ours_run(cfg, tmp / "d", rec, resume=False, epochs=range(split))
    ours_resumed = ours_run(cfg, tmp / "d", rec, resume=True)
    result["ours_resumed"] = summary(rec)
    result["ours_resumed_raw_vs_uninterrupted"] = max_diff(weights(ours_resumed.model), weights(ours.model))

    rec = Recorder()
    mid = split * cfg["iters"] + 2  # two steps into the epoch after the split
    ours_run(cfg, tmp / "e", rec, resume=False, stop_at=mid)
    ours_mid = ours_run(cfg, tmp / "e", rec, resume=True)
    result["ours_resumed_mid_epoch"] = summary(rec)
    result["ours_resumed_mid_epoch_raw_vs_uninterrupted"] = max_diff(
        weights(ours_mid.model), weights(ours.model)
    )

    # official's rule, from its scheduler: step k >= 1 uses update_lr(k); step 0 the optimizer's initial lr
    sched = LRScheduler(
        "yoloxwarmcos",
        BASIC_LR_PER_IMG * BATCH,
        cfg["iters"],
        cfg["max_epoch"],
        warmup_epochs=cfg["warmup_epochs"],
        warmup_lr_start=0,
        no_aug_epochs=cfg["no_aug_epochs"],
        min_lr_ratio=0.05,
    )
    total = cfg["max_epoch"] * cfg["iters"]
    result["update_lr_of_step_index"] = [sched.update_lr(k) for k in range(total)]
    return result


def collect(argv: list[str] | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_config(cfg, Path(tmp) / str(i)) for i, cfg in enumerate(CONFIGS)]
    return {"runs": results, "loader_close": batches_with_mosaic_after_close()}


if __name__ == "__main__":
    common.run(collect)
