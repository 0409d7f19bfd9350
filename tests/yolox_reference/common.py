"""What the comparison scripts share. They run under the reference python (official YOLOX 0.3.0 installed,
yolox_fast on PYTHONPATH), compute both sides, and print one JSON object as the last stdout line.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

warnings.filterwarnings("ignore")  # official YOLOX on a CPU: torch.cuda.amp deprecations, pin_memory
os.environ.setdefault("OMP_NUM_THREADS", "1")


def quiet_loguru() -> None:
    """Official YOLOX and yolox_fast both log through loguru to stderr; keep only warnings.

    Also undoes official `setup_logger`'s redirection of sys.stdout/stderr into loguru (call it again
    after building an official Trainer).
    """
    from loguru import logger

    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    logger.remove()
    logger.add(sys.stderr, level="WARNING")


def run(collect: Callable[[list[str] | None], dict[str, Any]]) -> None:
    """A script's entry point: quiet logs, one torch thread (small ops; the CPU is shared), then print
    `collect(sys.argv[1:])` as JSON."""
    import torch

    quiet_loguru()
    torch.set_num_threads(1)
    emit(collect(sys.argv[1:]))


def emit(result: dict[str, Any]) -> None:
    """Print `result` as the last stdout line (NaN/inf as null, so the JSON is strict)."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    sys.stdout.flush()
    print(json.dumps(clean(result)), flush=True)


def relative(a, b) -> float:
    """||a - b|| / ||b|| of two tensors, in float64 (0 when both are zero)."""
    denom = b.double().norm()
    diff = (a.double() - b.double()).norm()
    return 0.0 if diff == 0 else float(diff / denom) if denom > 0 else float("inf")


def official_nano_exp(num_classes: int):
    """Official YOLOX 0.3.0's yolox-nano exp with `num_classes`."""
    from yolox.exp import get_exp

    exp = get_exp(None, "yolox-nano")
    exp.num_classes = num_classes
    return exp


def ours_nano_exp(num_classes: int):
    """yolox_fast's yolox-nano exp with `num_classes` and YOLOX 0.3.0's SimOTA rule."""
    from benchmarks.kit.official import with_rule_0_3_0
    from yolox_fast.exp import get_exp

    exp = with_rule_0_3_0(get_exp(exp_name="yolox-nano"))
    exp.num_classes = num_classes
    return exp
