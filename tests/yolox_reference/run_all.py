"""Every comparison with official YOLOX 0.3.0 in one process (one import of torch and both YOLOXes):
what tests/test_vs_yolox.py runs. Prints {section: result} as JSON; a section that raised holds
{"error": traceback} instead, so the other sections still report.

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/run_all.py [SECTION ...]
"""

from __future__ import annotations

import sys
import time
import traceback

import augment_pieces
import common
import data_stats
import differences
import eval_pipeline
import loss_grad
import schedule
import trainer_steps
import zoo_init

SECTIONS = {
    "loss_grad": loss_grad.collect,
    "schedule": schedule.collect,
    "augment_pieces": augment_pieces.collect,
    "data_stats": data_stats.collect,
    "eval_pipeline": eval_pipeline.collect,
    "differences": differences.collect,
    "zoo_init": zoo_init.collect,
    "trainer_steps": trainer_steps.collect,
}


def collect(argv: list[str] | None = None) -> dict:
    names = argv or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}; known: {', '.join(SECTIONS)}")
    results = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            results[name] = SECTIONS[name]([])
        except Exception:  # noqa: BLE001 -- reported in the JSON, the other sections still run
            results[name] = {"error": traceback.format_exc()}
        results[name]["seconds"] = time.perf_counter() - t0
        common.quiet_loguru()  # a section may have reconfigured logging (official's setup_logger)
    return results


if __name__ == "__main__":
    common.run(collect)
    sys.exit(0)
