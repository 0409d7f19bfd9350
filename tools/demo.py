"""`python tools/demo.py ...` from a checkout runs yolox_fast/tools/demo.py, the tool an install runs as
`yolox_fast demo ...` or `python -m yolox_fast.tools.demo ...` (same flags)."""

from yolox_fast.core.cli import run_tool
from yolox_fast.tools.demo import main

if __name__ == "__main__":
    run_tool(main)
