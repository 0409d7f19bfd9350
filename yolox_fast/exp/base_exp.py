"""BaseExp: the experiment interface a trainer, evaluator or demo talks to, plus `merge` and printing."""

from __future__ import annotations

import ast
from abc import ABCMeta, abstractmethod
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

# fields holding paths or names stay strings even when they look like numbers ("data_dir 2017")
PATH_SUFFIXES = ("_dir", "_ann", "_file", "_name", "_json", "dataset")


class BaseExp(metaclass=ABCMeta):
    """Experiment: every knob of a run lives here as a plain attribute; subclasses override what differs."""

    def __init__(self) -> None:
        self.seed = None
        self.output_dir = "./YOLOX_outputs"
        self.print_interval = 100
        self.eval_interval = 10

    @abstractmethod
    def get_model(self): ...

    @abstractmethod
    def get_data_loader(
        self, batch_size: int, is_distributed: bool, no_aug: bool = False, cache_img=None
    ): ...

    @abstractmethod
    def get_optimizer(self, batch_size: int): ...

    @abstractmethod
    def get_lr_scheduler(self, lr: float, iters_per_epoch: int, **kwargs): ...

    @abstractmethod
    def get_evaluator(self, batch_size: int, is_distributed: bool): ...

    @abstractmethod
    def eval(self, model, evaluator, is_distributed: bool, half: bool = False): ...

    def fields(self) -> dict[str, Any]:
        """Public, plain-data attributes: what `merge` may set and what a checkpoint records."""
        plain = (int, float, str, bool, tuple, list, dict, type(None))
        return {
            k: v
            for k, v in vars(self).items()
            if not k.startswith("_") and k != "model" and isinstance(v, plain)
        }

    def __repr__(self) -> str:
        rows = [(k, repr(v)) for k, v in sorted(self.fields().items())]
        return tabulate(rows, headers=("key", "value"), tablefmt="fancy_grid")

    def merge(self, opts: Sequence[str]) -> None:
        """Apply trailing `KEY VALUE ...` overrides from the command line.

        Values are coerced to the type of the current value (bool accepts true/false/1/0,
        tuples and lists are parsed as Python literals). An unknown key or an uncoercible value
        raises ValueError naming it.
        """
        opts = list(opts)
        if len(opts) % 2:
            raise ValueError(f"exp overrides must be KEY VALUE pairs, got an odd list: {opts}")
        known = self.fields()
        for key, raw in zip(opts[0::2], opts[1::2]):
            if key not in known:
                close = [k for k in known if key.lower() in k.lower() or k.lower() in key.lower()]
                hint = f" (did you mean {', '.join(close[:3])}?)" if close else ""
                raise ValueError(f"unknown exp key {key!r}{hint}")
            setattr(self, key, _coerce(key, raw, getattr(self, key)))


def _coerce(key: str, raw: str, current: Any) -> Any:
    if current is None:
        return raw if key.endswith(PATH_SUFFIXES) else _literal_or_str(raw)
    try:
        if isinstance(current, bool):
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if isinstance(current, int):
            return int(float(raw)) if float(raw).is_integer() else _fail()
        if isinstance(current, float):
            return float(raw)
        if isinstance(current, (tuple, list)):
            value = ast.literal_eval(raw)
            if isinstance(value, (int, float)):
                value = (value, value) if len(current) == 2 else [value]
            if not isinstance(value, (tuple, list)):
                raise ValueError(raw)
            return type(current)(value)
        if isinstance(current, dict):
            value = ast.literal_eval(raw)
            if not isinstance(value, dict):
                raise ValueError(raw)
            return value
        return type(current)(raw)
    except (ValueError, SyntaxError) as err:
        raise ValueError(
            f"cannot set exp key {key!r} to {raw!r}: expected {type(current).__name__} like {current!r}"
        ) from err


def _fail():
    raise ValueError("not an integer")


def _literal_or_str(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw
