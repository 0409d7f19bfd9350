"""Repeated measurements of several sides, taken in turn so that load from other processes hits all alike."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

Value = TypeVar("Value")  # a measurement: seconds, a rate, or a row of them


def alternate(sides: dict[Hashable, Callable[[], Value]], repeats: int) -> dict[Hashable, list[Value]]:
    """Call each side's measurement once per round, in turn, for `repeats` rounds; every value."""
    values: dict[Hashable, list[Value]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, measure in sides.items():
            values[name].append(measure())
    return values


def value_range(values: Sequence[float], digits: int) -> str:
    """'min-max' of the repeats: how far load moved them."""
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"
