"""Exp field types: what a field may hold, how a command-line string becomes it, and the check.

A type is written with the usual typing forms: `int`, `float`, `bool`, `str`, `X | None`,
`tuple[int, int]` (fixed length), `tuple[str, ...]` (any length), `list[X]`, `dict`, `Literal[...]`.
An exp declares a field as an annotated class attribute (`input_size: tuple[int, int] = (640, 640)`):
`declared_types` reads the annotations; a field set without one has the type of its current value.
"""

from __future__ import annotations

import ast
import functools
import types
import typing
from typing import Any, Literal, Union

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
NONE_WORDS = ("none", "null")


class FieldTypeError(ValueError):
    """A value that does not fit a field's declared type."""


@functools.cache
def declared_types(cls: type) -> dict[str, Any]:
    """{field: type} of the annotated class attributes of `cls` and its bases, bases' first (a subclass's
    annotation of a name replaces its base's); ClassVar annotations are not fields."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError) as err:
        raise ValueError(
            f"exp class {cls.__qualname__}: a field's type annotation cannot be read ({err})"
        ) from err
    return {k: v for k, v in hints.items() if typing.get_origin(v) is not typing.ClassVar}


def type_of_value(value: Any) -> Any:
    """The type a field has when nothing is declared: its current value's (tuples keep their shape)."""
    if value is None:
        return Any
    if isinstance(value, tuple):
        return tuple[tuple(type_of_value(v) for v in value)] if value else tuple
    if isinstance(value, list):
        return list
    return type(value)


def describe(spec: Any) -> str:
    """`tuple[int, int] | None` for humans."""
    if spec is Any:
        return "any value"
    if isinstance(spec, type) and not typing.get_args(spec):
        return spec.__name__
    return str(spec).replace("typing.", "").replace("NoneType", "None")


def check(spec: Any, value: Any) -> bool:
    """Whether `value` fits `spec` (an int fits a float; a bool fits only bool)."""
    origin, args = typing.get_origin(spec), typing.get_args(spec)
    if spec is Any:
        return True
    if spec is type(None) or spec is None:
        return value is None
    if origin in (Union, types.UnionType):
        return any(check(a, value) for a in args)
    if origin is Literal:
        return value in args
    if spec is bool:
        return isinstance(value, bool)
    if spec is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if spec is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):  # exp files write [0.5, 1.5] as often as (0.5, 1.5)
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(check(args[0], v) for v in value)
        return len(value) == len(args) and all(check(a, v) for a, v in zip(args, value))
    if origin is list:
        return isinstance(value, list) and all(check(args[0], v) for v in value)
    if isinstance(spec, type):
        return isinstance(value, spec)
    return True


def coerce(spec: Any, raw: str) -> Any:
    """The value a command-line string means for a field of type `spec`; FieldTypeError if none."""
    text = raw.strip()
    origin, args = typing.get_origin(spec), typing.get_args(spec)
    if spec is Any:
        return _literal_or_str(text)
    if origin in (Union, types.UnionType):
        if type(None) in args and text.lower() in NONE_WORDS:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return coerce(option, raw)
            except FieldTypeError:
                continue
        raise FieldTypeError(raw)
    if spec is bool:
        if text.lower() in TRUE_WORDS:
            return True
        if text.lower() in FALSE_WORDS:
            return False
        raise FieldTypeError(raw)
    if spec is int:
        try:
            number = float(text)
        except ValueError:
            raise FieldTypeError(raw) from None
        if not number.is_integer():
            raise FieldTypeError(raw)
        return int(number)
    if spec is float:
        try:
            return float(text)
        except ValueError:
            raise FieldTypeError(raw) from None
    if spec is str:
        return raw
    value = _literal_or_str(text)
    if origin is tuple and isinstance(value, (int, float)) and len(args) == 2 and args[1] is not Ellipsis:
        value = (value, value)  # "input_size 512" means (512, 512)
    if isinstance(value, list) and origin is tuple:
        value = tuple(value)
    if origin is tuple and isinstance(value, tuple):
        value = tuple(float(v) if a is float and isinstance(v, int) else v for a, v in _pairs(args, value))
    if origin is list and isinstance(value, tuple):
        value = list(value)
    if not check(spec, value):
        raise FieldTypeError(raw)
    return value


def _pairs(args: tuple, value: tuple):
    if len(args) == 2 and args[1] is Ellipsis:
        return [(args[0], v) for v in value]
    return list(zip(args, value)) if len(args) == len(value) else [(Any, v) for v in value]


def _literal_or_str(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw
