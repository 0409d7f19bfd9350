"""`python tools/benchmark.py SUITE [options]` runs the benchmarks' dispatcher, `python -m benchmarks SUITE
[options]` (benchmarks/__main__.py), from any folder and under any python: the reference one too,
`$(tools/setup_yolox_reference.sh) tools/benchmark.py vs-yolox`."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks`
    from benchmarks.__main__ import main

    main(prog="python tools/benchmark.py")
