#!/usr/bin/env bash
# The GPU check (benchmarks/suites/gpu.py): assigner, training iteration, memory, the README's
# `train.py -f exps/yolox_nano.py -b 256 --fp16 --cache` against no cache, torchrun with 1 process and
# --compile, its checkpoint exported to TensorRT and fp16 TorchScript and scored, and the assigner's
# out-of-memory retry, against official YOLOX 0.3.0 in the same run; one table. About 15 minutes on one
# large GPU: `--only assigner iteration grad-checkpoint` and `--only train deploy oom` split it in two.
# Extra arguments go to the benchmark (e.g. --device cpu --small to try it on a CPU).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ref="$(tools/setup_yolox_reference.sh | tail -n 1)"
PYTHONUNBUFFERED=1 "$ref" tools/benchmark.py gpu "$@"
