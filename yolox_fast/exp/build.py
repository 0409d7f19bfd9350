"""get_exp: load an Exp from a Python file (-f), a model-zoo name (-n yolox-s) or the fields a checkpoint of
ours stores (-c best_ckpt.pth alone)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from loguru import logger

from yolox_fast.exp.base_exp import BaseExp

ZOO_DIR = Path(__file__).resolve().parent / "default"
ZOO = ("yolox_nano", "yolox_tiny", "yolox_s", "yolox_m", "yolox_l", "yolox_x", "yolox_voc_s")
# the example exps (the shapes quick start, the fine-tuning recipe, custom COCO / YOLO data), named as the zoo
EXAMPLES = ("shapes_nano", "finetune_nano", "custom_coco", "custom_yolo")


def _example_dir() -> Path:
    """The example exps: the package's copy (a wheel or `pip install .`; setup.py copies exps/example/ into
    it), else the checkout's exps/example/ (an editable install, a source tree), as data.paths.CONFIG_DIR."""
    installed = Path(__file__).resolve().parent / "example"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[2] / "exps" / "example"


EXAMPLE_DIR = _example_dir()


def get_exp_by_file(exp_file: str) -> BaseExp:
    """Import `exp_file` and return an instance of its `Exp` class."""
    path = Path(exp_file)
    if not path.is_file():
        raise FileNotFoundError(f"exp file not found: {exp_file}")
    module_name = f"_yolox_fast_exp_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "Exp"):
        raise AttributeError(f"{exp_file} defines no class named Exp")
    return module.Exp()


def exp_names() -> list[str]:
    """Every name `-n` takes: the zoo's, then the examples'."""
    return [name.replace("_", "-") for name in (*ZOO, *EXAMPLES)]


def get_exp_by_name(exp_name: str) -> BaseExp:
    """`yolox-s`, `yolox_s` or `YOLOX-S` -> the zoo exp yolox_fast/exp/default/yolox_s.py; `shapes-nano` ->
    the example exps/example/shapes_nano.py (shipped in the package)."""
    key = exp_name.strip().lower().replace("-", "_")
    if key in ZOO:
        return get_exp_by_file(str(ZOO_DIR / f"{key}.py"))
    if key in EXAMPLES:
        return get_exp_by_file(str(EXAMPLE_DIR / f"{key}.py"))
    raise ValueError(f"unknown exp name {exp_name!r}; known: {', '.join(exp_names())}")


def get_exp_by_checkpoint(ckpt_path: str) -> BaseExp:
    """The exp a checkpoint of ours was trained with: a default `Exp` given the exp fields the trainer stores
    in it ("exp"), so that `-c best_ckpt.pth` alone runs eval, demo and export as an exported file does.

    Methods a custom exp class overrides are not stored; its fields (model size, dataset, thresholds) are.
    Stored fields this version does not know are skipped and listed. A checkpoint without exp fields (official
    YOLOX's, a raw state_dict) is a ValueError asking for -f or -n.
    """
    from yolox_fast.exp.yolox_base import Exp
    from yolox_fast.utils.checkpoint import load_checkpoint

    stored = load_checkpoint(ckpt_path).get("exp")
    if not isinstance(stored, dict):
        raise ValueError(
            f"{ckpt_path} stores no exp fields (official YOLOX weights or a bare state_dict?): give the exp "
            "it was trained with (-f FILE or -n NAME)"
        )
    exp = Exp()
    known = exp.fields()
    unknown = sorted(k for k in stored if k not in known)
    for key, value in stored.items():
        if key in known:
            setattr(exp, key, tuple(value) if isinstance(known[key], tuple) and value is not None else value)
    if unknown:
        logger.info(f"{ckpt_path}: exp fields this version does not know, not applied: {', '.join(unknown)}")
    return exp


def get_exp(exp_file: str | None = None, exp_name: str | None = None, ckpt: str | None = None) -> BaseExp:
    """The Exp of `exp_file` if given, else of the zoo name `exp_name`, else the one checkpoint `ckpt` stores
    (`get_exp_by_checkpoint`)."""
    if exp_file:
        return get_exp_by_file(exp_file)
    if exp_name:
        return get_exp_by_name(exp_name)
    if ckpt:
        return get_exp_by_checkpoint(ckpt)
    raise ValueError("give an exp file (-f), an exp name (-n) or a checkpoint of ours (-c best_ckpt.pth)")
