"""The benchmark commands run as a user types them (tiny settings): they must work the day they matter."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_runs_on_a_cpu_without_official_yolox(tmp_path):
    cmd = [sys.executable, str(REPO / "tools" / "benchmark.py"), "gpu", "--device", "cpu", "--small",
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for row in ("| iteration", "| grad checkpoint", "| train.py --fp16 --cache", "| oom retry"):
        assert row in proc.stdout
    assert (
        "ours, per-image assigner" in proc.stdout and "official" not in proc.stdout.split("assigner, CPU")[1]
    )
