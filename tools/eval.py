"""`python tools/eval.py ...` from a checkout runs yolox_fast/tools/eval.py, the tool an install runs as
`yolox_fast eval ...` or `python -m yolox_fast.tools.eval ...` (same flags)."""

from yolox_fast.core.cli import run_tool
from yolox_fast.tools.eval import main

if __name__ == "__main__":
    run_tool(main)
