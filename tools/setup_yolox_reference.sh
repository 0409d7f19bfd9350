#!/usr/bin/env bash
# Create (or reuse) a virtual environment holding official YOLOX 0.3.0, for the comparisons against it:
# tests/test_vs_yolox.py and `python tools/benchmark.py fidelity`. yolox_fast itself never needs it.
#
#   tools/setup_yolox_reference.sh [DIR]      # default DIR: <repo>/.venv-yolox
#
# The reference environment sees the packages of the *active* Python (`$PYTHON`, default `python`), whatever
# that is: a venv, a virtualenv, a conda env or the system's Python. A venv's --system-site-packages would not
# do: made from inside a venv it exposes the base interpreter's packages, not the venv's. Instead a .pth file
# in DIR adds the active Python's site directories (their own .pth files, editable installs among them,
# included) after DIR's own, so torch, numpy, OpenCV, pycocotools and yolox_fast come from the active
# environment and both sides of a comparison run on the same torch. The .pth is rewritten on every run, so
# DIR follows the environment that last ran this script.
# YOLOX is installed without its dependencies (they would pull other torch/OpenCV builds) and built against
# that torch (--no-build-isolation). Run it again at any time: a ready environment is kept.
# Prints the reference python's path last (export it as YOLOX_REFERENCE_PYTHON to use another DIR).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$repo/.venv-yolox}"
base_python="${PYTHON:-python}"
ref="$dir/bin/python"

"$base_python" -c "import torch, cv2, pycocotools" || {
    echo "error: $base_python lacks torch, opencv or pycocotools; install yolox_fast's environment first" >&2
    exit 1
}

# One `import` line: site.addsitedir also runs the .pth files it finds there (editable installs).
parent_pth_line="$("$base_python" - <<'EOF'
import os
import site

dirs = site.getsitepackages()
if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
dirs = [os.path.realpath(d) for d in dirs if os.path.isdir(d)]
print(f"import site; list(map(site.addsitedir, {dirs!r}))")
EOF
)"

link_parent() {
    local site_dir
    site_dir="$("$ref" -c "import sysconfig; print(sysconfig.get_path('purelib'))")"
    printf '%s\n' "$parent_pth_line" > "$site_dir/_yolox_fast_parent_env.pth"
    # an environment made by an earlier version of this script saw the base interpreter's packages too
    sed -i 's/^include-system-site-packages = true$/include-system-site-packages = false/' "$dir/pyvenv.cfg"
}

ready() {
    [ -x "$ref" ] && "$ref" -c "import sys, yolox, torch; sys.exit(yolox.__version__ != '0.3.0')" 2>/dev/null
}

if [ -x "$ref" ]; then
    link_parent
fi
if ! ready; then
    "$base_python" -m venv "$dir"
    link_parent
    # build tools first: the YOLOX build below runs without isolation, in this environment
    "$ref" -m pip install --quiet wheel ninja
    "$ref" -m pip install --quiet --no-deps --no-build-isolation yolox==0.3.0 thop tqdm
    ready || { echo "error: YOLOX 0.3.0 does not import in $dir" >&2; exit 1; }
fi
torch_of() { "$1" -c "import os, torch; print(os.path.realpath(torch.__file__))"; }
[ "$(torch_of "$ref")" = "$(torch_of "$base_python")" ] || {
    echo "error: $ref does not run the torch of $base_python" >&2
    exit 1
}
echo "$ref"
