"""`python tools/visualize_assign.py ...` from a checkout runs yolox_fast/tools/visualize_assign.py,
the tool an install runs as `yolox_fast visualize-assign ...`
or `python -m yolox_fast.tools.visualize_assign ...` (same flags)."""

from yolox_fast.core.cli import run_tool
from yolox_fast.tools.visualize_assign import main

if __name__ == "__main__":
    run_tool(main)
