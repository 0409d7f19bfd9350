"""(e) The training side as a whole, from a fine-tuning start: yolox_fast's Trainer (as `tools/train.py -c
WEIGHTS` builds it: folded-BN refit, the class layer skipped, parameter groups, lr, EMA, channels-last,
`train_one_iter`; YOLOX 0.3.0's SimOTA rule set) against official YOLOX 0.3.0's loop pieces
(`benchmarks/kit/official.py`: its model from the refitted file the finetune benchmark writes,
`exp.get_optimizer`, `yoloxwarmcos`, ModelEMA), both fed the batch yolox_fast's loader gives the Trainer.

- start: the weights official loads (the benchmark's refitted file; the new class layer, random on both
  sides, copied from ours) against the Trainer's after its own refit: the same tensors.
- free run: both sides step on their own from that start; the loss and foreground count of each step
  (equal until an assignment flips on one side: SimOTA's choices are discrete, the float sums of the two
  sides differ in the last bits, and from the flip on the runs part as two seeds do).
- synchronised steps: before each compared step official is given ours' weights, BN statistics, momentum
  buffers and EMA; then both take that step on the same batch. Per step: the lr each used, the loss,
  and the relative difference of the weight update, the momentum buffer and the EMA update. Steps are
  picked in warmup, mid-run and after mosaic closes (L1 on, official's `use_l1`).

Default: a generated 4-class set at 128 px, batch 4, from an 80-class nano whose BN is folded (as the
shared COCO weights). On other data (`--data`, `--weights`, `--size`, `--batch`, `--steps E:I ...`) it
prints the same JSON; docs/results.md quotes it on the tiled raccoon photos.

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/trainer_steps.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import common
import torch

# (epoch, iteration), 0-based: the first two steps (lr 0, then warmup), mid-warmup, after warmup, and the
# first and last steps without mosaic; the tiny default recipe has 4 epochs of 4 steps, mosaic closes at 2
DEFAULT_STEPS = ((0, 0), (0, 1), (0, 3), (1, 2), (2, 0), (3, 3))


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in tensors])


def build_ours(data: str, weights: str, fields: dict, batch: int, out: Path):
    """yolox_fast's Trainer as `tools/train.py -n yolox-nano -c WEIGHTS -b BATCH KEY VALUE ...` makes it,
    with YOLOX 0.3.0's SimOTA rule, after before_train (refit done, loader and EMA made)."""
    from benchmarks.kit.commands import overrides
    from benchmarks.kit.official import RULE_0_3_0_FIELDS
    from yolox_fast.core.cli import build_exp, parse_with_overrides
    from yolox_fast.core.trainer import Trainer
    from yolox_fast.tools.train import make_parser

    fields = {**fields, **RULE_0_3_0_FIELDS}
    opts = overrides({**fields, "dataset": data, "output_dir": out, "save_history_ckpt": False})
    argv = ["-n", "yolox-nano", "-c", weights, "-b", str(batch), "-expn", "steps", "-l", "none", *opts]
    args = parse_with_overrides(make_parser(), [str(a) for a in argv])
    trainer = Trainer(build_exp(args), args)
    trainer.before_train()
    return trainer


def build_official(fields: dict, refitted: Path, ours_model, batch: int, max_iter: int):
    """Official's model from the refitted file (`load_ckpt`, as its -c), the new class layer set to ours'
    (both random), its optimizer, lr scheduler and EMA."""
    from yolox.utils import ModelEMA

    from benchmarks.kit.official import official_model, official_nano_exp

    exp = official_nano_exp(fields)
    model = official_model(exp, str(refitted))
    new_layer = {k: v for k, v in ours_model.state_dict().items() if k.startswith("head.cls_preds.")}
    model.load_state_dict(new_layer, strict=False)
    optimizer = exp.get_optimizer(batch)
    scheduler = exp.get_lr_scheduler(exp.basic_lr_per_img * batch, max_iter)
    return exp, model, optimizer, scheduler, ModelEMA(model, 0.9998)


def start_difference(ours_model, official_model) -> float:
    """The largest relative difference over the state dicts' float tensors."""
    theirs = official_model.state_dict()
    return max(
        common.relative(v, theirs[k]) for k, v in ours_model.state_dict().items() if v.dtype.is_floating_point
    )


class Sides:
    """Both sides built on the same data and start, and one step of each on the batch the Trainer draws."""

    def __init__(self, data: str, weights: str, fields: dict, batch: int, out: Path) -> None:
        from benchmarks.suites.finetune import read_set, refitted_weights

        self.trainer = build_ours(data, weights, fields, batch, out / "ours")
        self.model = self.trainer.model
        _, train, _ = read_set(data, batch)
        refitted = refitted_weights(weights, None, train, fields["input_size"][0], out)
        self.exp, self.official, self.optimizer, self.scheduler, self.ema = build_official(
            fields, refitted, self.model, batch, self.trainer.max_iter
        )
        self.batches: list = []
        draw = self.trainer._next_batch

        def recorded():
            imgs, targets = draw()
            self.batches.append((imgs.detach().clone().contiguous(), targets.clone()))
            return imgs, targets

        self.trainer._next_batch = recorded

    def close_mosaic_if_due(self, epoch: int) -> None:
        """Ours' before_epoch closes mosaic and turns L1 on at its epoch; official's loop sets use_l1 then."""
        self.trainer.epoch = epoch
        if epoch >= self.trainer.mosaic_close_epoch and not self.trainer.no_aug:
            self.trainer.before_epoch()
            self.official.head.use_l1 = True

    def step(self, epoch: int, it: int) -> dict:
        """Ours' train_one_iter at (epoch, it), then official's step on its batch; returns what each used."""
        trainer = self.trainer
        trainer.epoch, trainer.iter = epoch, it
        progress = epoch * trainer.max_iter + it
        official_lr = self.optimizer.param_groups[0]["lr"]
        trainer.train_one_iter()
        imgs, targets = self.batches[-1]
        imgs, targets = self.exp.preprocess(imgs.float().contiguous(), targets.float(), self.exp.input_size)
        out = self.official(imgs, targets)
        self.optimizer.zero_grad()
        out["total_loss"].backward()
        self.optimizer.step()
        self.ema.update(self.official)
        lr = self.scheduler.update_lr(progress + 1)  # official sets the next step's lr after a step
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return {
            "epoch": epoch,
            "iter": it,
            "lr_ours": trainer.optimizer.param_groups[0]["lr"],
            "lr_official": official_lr,
            "loss_ours": trainer.meter["total_loss"].latest,
            "loss_official": float(out["total_loss"]),
            # foreground anchors per GT: where the assignments part, this parts too (most often)
            "fg_per_gt_ours": trainer.meter["num_fg"].latest,
            "fg_per_gt_official": float(out["num_fg"]),
            "use_l1_ours": bool(self.model.head.use_l1),
            "use_l1_official": bool(self.official.head.use_l1),
        }

    def synchronise(self, progress: int) -> None:
        """Official takes ours' weights, BN statistics, momentum buffers, EMA and lr."""
        self.official.load_state_dict(self.model.state_dict())
        theirs = dict(self.official.named_parameters())
        for name, p in self.model.named_parameters():
            buffer = self.trainer.optimizer.state.get(p, {}).get("momentum_buffer")
            if buffer is not None:
                self.optimizer.state[theirs[name]]["momentum_buffer"] = buffer.detach().clone().contiguous()
        self.ema.ema.load_state_dict(self.trainer.ema_model.ema.state_dict())
        self.ema.updates = self.trainer.ema_model.updates
        for group in self.optimizer.param_groups:
            group["lr"] = self.scheduler.update_lr(progress)

    def synchronised_step(self, epoch: int, it: int) -> dict:
        self.close_mosaic_if_due(epoch)
        self.synchronise(epoch * self.trainer.max_iter + it)
        names = [n for n, _ in self.model.named_parameters()]
        before = flat(p for _, p in self.model.named_parameters())
        ema_before = flat(self.trainer.ema_model.ema.state_dict()[n] for n in names)
        record = self.step(epoch, it)
        theirs = dict(self.official.named_parameters())
        ours_update = flat(p for _, p in self.model.named_parameters()) - before
        official_update = flat(theirs[n] for n in names) - before
        ours_buffers = [
            self.trainer.optimizer.state[p]["momentum_buffer"] for _, p in self.model.named_parameters()
        ]
        official_buffers = [self.optimizer.state[theirs[n]]["momentum_buffer"] for n in names]
        ours_ema = flat(self.trainer.ema_model.ema.state_dict()[n] for n in names) - ema_before
        official_ema = flat(self.ema.ema.state_dict()[n] for n in names) - ema_before
        stats = [k for k, v in self.model.state_dict().items() if k.endswith(("running_mean", "running_var"))]
        official_state = self.official.state_dict()
        moved = official_update.norm() > 1e-6 * before.norm()  # a step at lr 0 moves nothing (rounding)
        ema_moved = official_ema.norm() > 1e-6 * ema_before.norm()
        record.update(
            update=common.relative(ours_update, official_update) if moved else None,
            update_norm=float(official_update.norm()),
            momentum=common.relative(flat(ours_buffers), flat(official_buffers)),
            ema_update=common.relative(ours_ema, official_ema) if ema_moved else None,
            bn_stats=common.relative(
                flat(self.model.state_dict()[k] for k in stats), flat(official_state[k] for k in stats)
            ),
        )
        return record


def tiny_case(tmp: Path) -> tuple[str, str, argparse.Namespace]:
    """The generated set, a folded 80-class nano, and the recipe flags of the default run."""
    sys.path.insert(0, str(common.REPO / "tests"))
    from test_finetune import save_folded_coco_nano

    from benchmarks.kit.fidelity_data import make_fidelity_set
    from benchmarks.kit.recipe import recipe_args

    data = make_fidelity_set(tmp / "set", num_train=16, num_val=4, size=128)
    weights = tmp / "coco_nano_folded.pth"
    save_folded_coco_nano(weights)
    flags = recipe_args(size=128, epochs=4, batch=4, workers=0, warmup_epochs=2, no_aug_epochs=1,
                        mosaic_prob=1.0, basic_lr_per_img=0.01 / 64, eval_interval=10)  # fmt: skip
    return str(data), str(weights), flags


def collect(argv: list[str]) -> dict:
    from benchmarks.kit.recipe import add_recipe_arguments, recipe
    from yolox_fast.data.build import dataset_class_names
    from yolox_fast.exp import Exp

    p = argparse.ArgumentParser()
    p.add_argument("--data")
    p.add_argument("--weights")
    p.add_argument("--steps", nargs="*", default=[f"{e}:{i}" for e, i in DEFAULT_STEPS])
    p.add_argument("--free-steps", type=int, default=3)
    add_recipe_arguments(p, size=416, epochs=15, batch=8, basic_lr_per_img=0.01 / 64, mosaic_prob=1.0,
                         eval_interval=1, workers=0)  # fmt: skip
    args = p.parse_args(argv)
    steps = [tuple(int(x) for x in s.split(":")) for s in args.steps]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.data:
            data, weights, flags = args.data, args.weights, args
        else:
            data, weights, flags = tiny_case(tmp)
        probe = Exp()
        probe.dataset = data
        fields = {**recipe(flags, 0), "num_classes": len(dataset_class_names(probe))}
        free = Sides(data, weights, fields, flags.batch, tmp / "free")
        result = {"start": start_difference(free.model, free.official), "free": []}
        for k in range(args.free_steps):
            result["free"].append(free.step(*divmod(k, free.trainer.max_iter)))
        synced = Sides(data, weights, fields, flags.batch, tmp / "synced")
        result["synchronised"] = [synced.synchronised_step(e, i) for e, i in steps]
        result["iters_per_epoch"] = synced.trainer.max_iter
        return result


if __name__ == "__main__":
    common.run(collect)
