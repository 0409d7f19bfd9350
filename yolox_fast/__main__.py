"""The `yolox_fast` command (and `python -m yolox_fast`): `yolox_fast COMMAND [flags]`, COMMAND a tool of
yolox_fast/tools/ with the flags of `python tools/TOOL.py` in a checkout, or `benchmark`, which runs a
checkout's tools/benchmark.py (the benchmarks are not part of the package)."""

from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path

from yolox_fast import __version__
from yolox_fast.core.cli import run_tool

# command -> (module of yolox_fast.tools, what it does)
COMMANDS = {
    "train": ("train", "train (one process, -d K processes, or under torchrun)"),
    "eval": ("eval", "COCO/VOC evaluation of a checkpoint or an exported file"),
    "demo": ("demo", "detect objects in images, a video or a webcam stream"),
    "export": ("export", "ONNX, OpenVINO, TorchScript, TensorRT, checked against PyTorch"),
    "export-onnx": ("export_onnx", "official YOLOX's ONNX export flags"),
    "check": ("check_dataset", "read a dataset without training: counts, problems, label plots"),
    "make-dataset": ("make_dataset", "write the synthetic shapes set in COCO, VOC or YOLO format"),
    "visualize-assign": ("visualize_assign", "draw which anchors SimOTA assigned to each ground truth"),
}
BENCHMARK = "benchmark"


def usage() -> str:
    rows = [f"  {name:<18}{what}" for name, (_, what) in COMMANDS.items()]
    rows.append(f"  {BENCHMARK:<18}the benchmarks of a checkout (python tools/benchmark.py SUITE)")
    return (
        f"usage: yolox_fast COMMAND [flags]   (yolox_fast {__version__}; COMMAND -h for its flags)\n"
        "commands:\n" + "\n".join(rows)
    )


def checkout_benchmark() -> Path | None:
    """tools/benchmark.py of the checkout this package runs from (an editable install or a source tree), else
    of the working directory (a clone next to an installed package), else None."""
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        script = root / "tools" / "benchmark.py"
        if script.is_file():
            return script
    return None


def run_benchmark(argv: list[str]) -> None:
    """Run a checkout's tools/benchmark.py with `argv`, as `python tools/benchmark.py ARGV` does."""
    script = checkout_benchmark()
    if script is None:
        raise SystemExit(
            "error: the benchmarks live in the yolox_fast repository (benchmarks/), not in the "
            "installed package: run `yolox_fast benchmark ...` or `python tools/benchmark.py ...` in a clone"
        )
    sys.argv = [str(script), *argv]
    runpy.run_path(str(script), run_name="__main__")


def main(argv: list[str] | None = None) -> None:
    """Dispatch `yolox_fast COMMAND ...` to the tool's `main`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0 if argv else 2)
    if argv[0] == "--version":
        print(f"yolox_fast {__version__}")
        return
    command, rest = argv[0], argv[1:]
    if command == BENCHMARK:
        run_benchmark(rest)
        return
    if command not in COMMANDS:
        print(f"yolox_fast: unknown command {command!r}\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    tool = importlib.import_module(f"yolox_fast.tools.{COMMANDS[command][0]}")
    sys.argv = [f"yolox_fast {command}", *rest]  # what argparse's usage line and error messages show
    run_tool(lambda: tool.main(rest))


if __name__ == "__main__":
    main()
