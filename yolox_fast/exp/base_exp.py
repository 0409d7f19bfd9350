"""BaseExp: the experiment interface a trainer, evaluator or demo talks to, plus `merge` and printing."""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from yolox_fast.exp.fields import FieldTypeError, check, coerce, declared_types, describe, type_of_value

# fields holding paths or names stay strings even when they look like numbers ("data_dir 2017")
PATH_SUFFIXES = ("_dir", "_ann", "_file", "_name", "_json", "dataset")
_UNSET = object()  # a declared field without a value (yet)


class BaseExp(metaclass=ABCMeta):
    """Experiment: every knob of a run is a field, declared once as an annotated class attribute (the
    annotation is its type, see exp/fields.py); subclasses override what differs, as class attributes or
    in `__init__`. A field an exp sets in `__init__` without a declaration has its value's type."""

    seed: int | None = None
    output_dir: str = "./YOLOX_outputs"
    print_interval: int = 100
    eval_interval: int = 10

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
        """Public, plain-data attributes: the declared fields (bases' first, in declaration order), then what
        the exp set without declaring it. What `merge` may set and what a checkpoint records."""
        plain = (int, float, str, bool, tuple, list, dict, type(None))
        found = {}
        for key in dict.fromkeys([*declared_types(type(self)), *vars(self)]):
            value = getattr(self, key, _UNSET)
            if not key.startswith("_") and key != "model" and isinstance(value, plain):
                found[key] = value
        return found

    def __repr__(self) -> str:
        rows = [(k, repr(v)) for k, v in sorted(self.fields().items())]
        return tabulate(rows, headers=("key", "value"), tablefmt="fancy_grid")

    def field_type(self, key: str) -> Any:
        """The declared type of field `key` (its annotation in this class or a base), else its value's."""
        declared = declared_types(type(self))
        return declared[key] if key in declared else type_of_value(getattr(self, key))

    def merge(self, opts: Sequence[str]) -> None:
        """Apply trailing `KEY VALUE ...` overrides from the command line.

        Values are parsed for the field's type (`field_type`: bool accepts true/false/1/0, tuples and
        lists are Python literals, `none` clears an optional field) and checked against it, shape
        included. An unknown key or a value that does not fit raises ValueError naming both.
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
            spec = self.field_type(key)
            if spec is Any and key.endswith(PATH_SUFFIXES):
                spec = str
            try:
                value = coerce(spec, raw)
            except FieldTypeError:
                raise ValueError(
                    f"cannot set exp key {key!r} to {raw!r}: expected {describe(spec)}, "
                    f"like {getattr(self, key)!r}"
                ) from None
            setattr(self, key, value)

    def validate(self) -> None:
        """ValueError listing every field whose value does not fit its declared type (an exp file can set
        `input_size = (640,)` as easily as the command line)."""
        bad = []
        for key, value in self.fields().items():
            spec = self.field_type(key)
            if not check(spec, value):
                bad.append(f"{key} = {value!r} (expected {describe(spec)})")
        if bad:
            raise ValueError(f"exp {getattr(self, 'exp_name', type(self).__name__)}: " + "; ".join(bad))
