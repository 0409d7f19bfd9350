#!/usr/bin/env bash
# The GPU check (tools/benchmarks/gpu.py): assigner, training iteration, memory, a short fp16 run, its
# checkpoint exported to TensorRT and fp16 TorchScript and scored, and the assigner's out-of-memory retry,
# against official YOLOX 0.3.0 in the same run. About 10 minutes on one
# large GPU. Extra arguments go to the benchmark (e.g. --device cpu --small to try it on a CPU).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ref="$(tools/setup_yolox_reference.sh | tail -n 1)"
PYTHONUNBUFFERED=1 "$ref" tools/benchmark.py gpu "$@"
