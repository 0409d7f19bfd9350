#!/usr/bin/env bash
# Create (or reuse) a virtual environment holding official YOLOX 0.3.0, for the comparisons against it:
# tests/test_vs_yolox.py and `python tools/benchmark.py fidelity`. yolox_fast itself never needs it.
#
#   tools/setup_yolox_reference.sh [DIR]      # default DIR: <repo>/.venv-yolox
#
# The venv sees this Python's packages (--system-site-packages): torch, numpy, OpenCV, pycocotools and
# yolox_fast come from the main environment, so both sides of a comparison run on the same torch.
# YOLOX is installed without its dependencies (they would pull other torch/OpenCV builds) and built
# against that torch (--no-build-isolation). Run it again at any time: a ready environment is kept.
# Prints the reference python's path last (export it as YOLOX_REFERENCE_PYTHON to use another DIR).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$repo/.venv-yolox}"
base_python="${PYTHON:-python}"
ref="$dir/bin/python"

ready() {
    [ -x "$ref" ] && "$ref" -c "import sys, yolox, torch; sys.exit(yolox.__version__ != '0.3.0')" 2>/dev/null
}

if ! ready; then
    "$base_python" -c "import torch, cv2, pycocotools" || {
        echo "error: $base_python lacks torch, opencv or pycocotools; install yolox_fast's environment first" >&2
        exit 1
    }
    "$base_python" -m venv --system-site-packages "$dir"
    # build tools first: the YOLOX build below runs without isolation, in this environment
    "$ref" -m pip install --quiet wheel ninja
    "$ref" -m pip install --quiet --no-deps --no-build-isolation yolox==0.3.0 thop tqdm
    ready || { echo "error: YOLOX 0.3.0 does not import in $dir" >&2; exit 1; }
fi
echo "$ref"
