"""The benchmarks' dispatcher: `python -m benchmarks SUITE [options]` from the repository root, or
`python tools/benchmark.py SUITE [options]` from any folder and under any python (the same dispatcher).

Each suite prints its figures and the ratio against a baseline measured in the same run; `SUITE -h` lists
its options. A suite is a module of benchmarks/suites/ with a `main(argv)`; it imports benchmarks/kit/ (what
the suites share), yolox_fast and third-party packages, never another suite.
"""

from __future__ import annotations

import importlib
import sys

# suite -> (module of benchmarks/suites, arguments put before the user's, what it measures)
SUITES = {
    "simota": ("simota", (), "batched vs per-image SimOTA: time and peak memory"),
    "data": ("data", (), "loader samples/s uncached vs ram vs disk cache; cache PSS with 4 workers"),
    "demo": ("demo", (), "demo images/s at batch 1, 8, 32"),
    "train": ("train", (), "training img/s with the batched vs the reference assigner"),
    "eval": ("eval", (), "COCO scoring seconds, faster-coco-eval vs pycocotools"),
    "fidelity": ("fidelity", (), "accuracy against official YOLOX 0.3.0"),
    "finetune": ("finetune", (), "fine-tuning on real photos against official YOLOX 0.3.0"),
    "vs-yolox": ("vs_yolox", (), "speed against official YOLOX 0.3.0"),
    "deploy": ("deploy", (), "each export format and precision: AP, latency, throughput, size vs PyTorch"),
    "gpu": ("gpu", (), "every GPU figure the docs claim, one table (tools/gpu_check.sh runs it)"),
    "ab": ("ab", (), "one change vs its baseline, alternated round by round: ab {stem,workers,allocator}"),
    "workers": ("ab", ("workers",), "= ab workers: training, loader workers at nice 0 vs nice 19"),
    "allocator": ("ab", ("allocator",), "= ab allocator: demo and eval, glibc keeping freed memory or not"),
    "stem": ("ab", ("stem",), "= ab stem: the Focus stem as one strided conv vs phases, then the conv"),
    "scale": ("scale", (), "the data path at COCO's size against official YOLOX 0.3.0"),
    "track": ("track", (), "ByteTrack vs a plain IoU tracker on generated videos: MOTA, IDF1, time"),
}


def usage(prog: str) -> str:
    rows = [f"  {name:<11}{what}" for name, (_, _, what) in SUITES.items()]
    return (
        f"usage: {prog} {{{','.join(SUITES)}}} [options]   (-h after a suite for its options)\n"
        "suites:\n" + "\n".join(rows) + "\n"
        "fidelity, finetune, vs-yolox and scale import official YOLOX: run them with the reference python,\n"
        "  $(tools/setup_yolox_reference.sh) tools/benchmark.py SUITE"
    )


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks") -> None:
    """Run suite argv[0] with the rest of `argv` (default: the command line's); without a known suite,
    print the usage and the suites (exit 0 for -h/--help, else 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in SUITES:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        if argv and not asked:
            print(f"unknown suite {argv[0]!r}", file=sys.stderr)
        print(usage(prog))
        sys.exit(0 if asked else 2)
    module, first, _ = SUITES[argv[0]]
    importlib.import_module(f"benchmarks.suites.{module}").main([*first, *argv[1:]])


if __name__ == "__main__":
    main()
