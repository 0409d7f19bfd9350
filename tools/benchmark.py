"""Benchmarks: `python tools/benchmark.py SUITE [options]`, SUITE one of SUITES below.

Each prints its figures and the ratio against a baseline measured in the same run.
"""

import importlib
import sys

SUITES = ("simota", "data", "demo", "train", "eval", "fidelity", "finetune", "vs-yolox", "deploy", "gpu",
          "workers", "allocator", "stem", "scale", "track")  # fmt: skip


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in SUITES:
        print(
            f"usage: python tools/benchmark.py {{{','.join(SUITES)}}} [options]"
            "   (-h after a suite for its options)"
        )
        sys.exit(2)
    suite = importlib.import_module(f"benchmarks.{sys.argv[1].replace('-', '_')}")
    suite.main(sys.argv[2:])


if __name__ == "__main__":
    main()
