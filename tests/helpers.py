"""Helpers shared by the test modules (tests/ is on sys.path when pytest runs them)."""

import subprocess
import sys
from pathlib import Path

from yolox_fast.exp import Exp

REPO = Path(__file__).resolve().parents[1]


def run_tool_process(tool: str, *args: str, cwd: Path, timeout: int = 300) -> str:
    """`python tools/<tool>.py args...` in a fresh process, as a user types it, from `cwd`; asserts it exited
    0 and returns its stdout + stderr."""
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / f"{tool}.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out


def exp_for(dataset: str, /, **fields) -> Exp:
    """A default Exp on `dataset` for the tiny generated sets: 6 classes, 128 px, no loader workers, seed 0;
    `fields` override any of it."""
    exp = Exp()
    exp.dataset = dataset
    exp.num_classes = 6
    exp.input_size = exp.test_size = (128, 128)
    exp.data_num_workers = 0
    exp.seed = 0
    for key, value in fields.items():
        setattr(exp, key, value)
    return exp
