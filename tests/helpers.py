"""Helpers shared by the test modules (tests/ is on sys.path when pytest runs them)."""

import contextlib
import importlib
import io
import os
import runpy
import struct
import subprocess
import sys
import traceback
import zlib
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from yolox_fast.exp import Exp

REPO = Path(__file__).resolve().parents[1]


def load_tool(name: str):
    """The command-line tool `name` as a module: the package's `yolox_fast.tools.<name>`
    (`load_tool("demo")`). The benchmark suites, which live in the checkout only, are
    `benchmarks.suites.<name>` (the repository root is on pytest's path)."""
    return importlib.import_module(f"yolox_fast.tools.{name}")


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
    return _output_of_success(tool, args, done)


def run_tool_in_process(tool: str, *args, cwd: Path = REPO) -> str:
    """`run_tool_process` through `run_tool_here`: the same command line, exit check and output, in this
    process (no interpreter start and imports, about 3 s)."""
    return _output_of_success(tool, args, run_tool_here(tool, *args, cwd=cwd))


def _output_of_success(tool: str, args, done) -> str:
    """stdout + stderr of a finished tool run; fails the test, naming the command, on a non-zero exit."""
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"tools/{tool}.py {' '.join(map(str, args))} failed:\n{out[-4000:]}"
    return out


@dataclass
class ToolRun:
    """What a finished `python tools/<tool>.py` run leaves: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def _said_once_a_process() -> list[tuple[object, str, object]]:
    """(owner, attribute, its value in a fresh process) of the messages the package logs once a process."""
    from yolox_fast.data.augment import TrainTransform
    from yolox_fast.data.datasets.base import DetectionDataset
    from yolox_fast.utils import amp

    return [
        (DetectionDataset, "_warned_orientation", False),
        (TrainTransform, "_warned_truncation", False),
        (amp, "_warned_cpu_fp16", False),
    ]


def run_tool_here(tool: str, *args, cwd: Path = REPO) -> ToolRun:
    """`python tools/<tool>.py args...` as the interpreter runs it (the file as __main__, sys.argv as typed,
    from `cwd`), in this process: the exit code, stdout and stderr a fresh process gives (an uncaught
    exception: its traceback and exit code 1; the messages logged once a process said again), without the
    interpreter start and imports of one (about 3 s each). For the runs whose process itself is not what the
    test is about."""
    script = str(REPO / "tools" / f"{tool}.py")
    once = _said_once_a_process()
    saved = [getattr(owner, name) for owner, name, _ in once]
    for owner, name, fresh in once:
        setattr(owner, name, fresh)
    argv, here, out, err = sys.argv, os.getcwd(), io.StringIO(), io.StringIO()
    sys.argv = [script, *map(str, args)]
    logger.remove()  # a fresh process logs to its own stderr until the tool sets up its logger
    logger.add(err, level="DEBUG")
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
            except Exception:  # noqa: BLE001 -- what the interpreter does with it: traceback, exit code 1
                traceback.print_exc()
                code = 1
    finally:
        for (owner, name, _), value in zip(once, saved):
            setattr(owner, name, value)
        os.chdir(here)
        sys.argv = argv
        logger.remove()  # the tool's sinks (its log file, the captured stderr) end with it
        logger.add(sys.stderr)
    return ToolRun(code, out.getvalue(), err.getvalue())


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


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(path: Path, width: int, height: int) -> Path:
    """A PNG whose header says width x height (8-bit gray) with only one row of data: its size is all a
    reader may look at."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    row = zlib.compress(b"\x00" * (width + 1))
    png = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", row)
    path.write_bytes(png + _png_chunk(b"IEND", b""))
    return path
