"""The command lines the suites start in fresh processes: a tool of this checkout (`tools/<name>.py`, the
benchmarks' own `tools/benchmark.py` too) as a user types it, exp fields as its KEY VALUE overrides, and the
step lines of a `tools/train.py` log."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# a logged training step: epoch, iter_time (s), total_loss
STEP_LINE = re.compile(r"epoch: (\d+)/\d+, iter: \d+/\d+, .*?iter_time: ([0-9.]+)s, .*?total_loss: ([0-9.]+)")


def tool(name: str, *args, python: Sequence[str] = (sys.executable,)) -> list[str]:
    """`python tools/<name>.py args...` (`python`: what starts it, this interpreter or e.g. torchrun)."""
    return [*python, str(REPO / "tools" / f"{name}.py"), *map(str, args)]


def overrides(fields: dict) -> list[str]:
    """Exp fields as the tools' KEY VALUE arguments, a tuple's spaces dropped ("(416,416)")."""
    text = [str(v).replace(" ", "") if isinstance(v, tuple | list) else str(v) for v in fields.values()]
    return [x for kv in zip(fields, text) for x in kv]
