"""get_exp: load an Exp from a Python file (-f) or a model-zoo name (-n yolox-s)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from yolox_fast.exp.base_exp import BaseExp

ZOO_DIR = Path(__file__).resolve().parent / "default"
ZOO = ("yolox_nano", "yolox_tiny", "yolox_s", "yolox_m", "yolox_l", "yolox_x", "yolox_voc_s")


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


def get_exp_by_name(exp_name: str) -> BaseExp:
    """`yolox-s`, `yolox_s` or `YOLOX-S` -> the zoo exp yolox_fast/exp/default/yolox_s.py."""
    key = exp_name.strip().lower().replace("-", "_")
    if key not in ZOO:
        raise ValueError(
            f"unknown exp name {exp_name!r}; known: {', '.join(z.replace('_', '-') for z in ZOO)}"
        )
    return get_exp_by_file(str(ZOO_DIR / f"{key}.py"))


def get_exp(exp_file: str | None = None, exp_name: str | None = None) -> BaseExp:
    """The Exp of `exp_file` if given, else of the zoo name `exp_name`."""
    if exp_file:
        return get_exp_by_file(exp_file)
    if exp_name:
        return get_exp_by_name(exp_name)
    raise ValueError("give an exp file (-f) or an exp name (-n)")
