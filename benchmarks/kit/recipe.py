"""The recipe both sides of a side-by-side run train with (official's exp attribute names are yolox_fast's):
`recipe` the exp fields, `add_recipe_arguments` the flags it reads, `recipe_args` those flags' values without
a command line."""

from __future__ import annotations

import argparse

from benchmarks.kit.fidelity_data import CLASS_NAMES


def recipe(args, seed: int) -> dict:
    """The exp fields both sides get (official attribute names = yolox_fast's)."""
    size = (args.size, args.size)
    return {
        "num_classes": len(CLASS_NAMES), "input_size": size, "test_size": size, "multiscale_range": 0,
        "random_size": (args.size // 32, args.size // 32), "mosaic_prob": args.mosaic_prob,
        "mosaic_scale": tuple(args.mosaic_scale), "enable_mixup": False, "degrees": args.degrees,
        "translate": args.translate, "shear": args.shear, "hsv_prob": 1.0, "flip_prob": 0.5,
        "warmup_epochs": args.warmup_epochs, "warmup_lr": 0, "no_aug_epochs": args.no_aug_epochs,
        "max_epoch": args.epochs, "basic_lr_per_img": args.basic_lr_per_img,
        "min_lr_ratio": args.min_lr_ratio, "eval_interval": args.eval_interval,
        "data_num_workers": args.workers, "seed": seed, "test_conf": 0.01, "nmsthre": 0.65, "ema": True,
    }  # fmt: skip


def add_recipe_arguments(parser: argparse.ArgumentParser, **defaults) -> None:
    """The flags `recipe` reads (both side-by-side benchmarks take them), with the fidelity suite's defaults
    unless `defaults` (flag name with underscores -> value) says otherwise."""
    d = {"size": 160, "epochs": 30, "batch": 16, "workers": 2, "threads": 1, "warmup_epochs": 1,
         "no_aug_epochs": 2, "basic_lr_per_img": 0.05 / 64, "min_lr_ratio": 0.05, "eval_interval": 5,
         "mosaic_prob": 0.5, "mosaic_scale": [0.5, 1.5], "degrees": 10.0, "translate": 0.1, "shear": 2.0,
         **defaults}  # fmt: skip
    parser.add_argument("--size", type=int, default=d["size"], help="training and test input side (x 32)")
    parser.add_argument("--mosaic-scale", type=float, nargs=2, default=d["mosaic_scale"])
    for name in ("epochs", "batch", "warmup_epochs", "no_aug_epochs", "eval_interval"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=d[name])
    for name in ("basic_lr_per_img", "min_lr_ratio", "mosaic_prob", "degrees", "translate", "shear"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=d[name])
    parser.add_argument("--workers", type=int, default=d["workers"], help="data loader workers, each run")
    parser.add_argument("--threads", type=int, default=d["threads"], help="torch threads, each run")


def recipe_args(**values) -> argparse.Namespace:
    """What `add_recipe_arguments` parses from an empty command line, `values` (flag name with underscores ->
    value) in place of its defaults."""
    parser = argparse.ArgumentParser()
    add_recipe_arguments(parser, **values)
    return parser.parse_args([])
