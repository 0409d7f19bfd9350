"""Benchmarks: `python tools/benchmark.py SUITE [options]`, SUITE one of SUITES below.

Each prints its figures and the ratio against a baseline measured in the same run.
"""

import importlib
import sys
from pathlib import Path

SUITES = ("simota", "data", "demo", "train", "eval", "fidelity", "finetune", "vs-yolox", "deploy", "gpu",
          "workers", "allocator", "stem", "scale", "track")  # fmt: skip


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in SUITES:
        print(
            f"usage: python tools/benchmark.py {{{','.join(SUITES)}}} [options]"
            "   (-h after a suite for its options)"
        )
        sys.exit(2)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks`
    suite = importlib.import_module(f"benchmarks.suites.{sys.argv[1].replace('-', '_')}")
    suite.main(sys.argv[2:])


if __name__ == "__main__":
    main()
