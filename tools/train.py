"""`python tools/train.py ...` from a checkout runs yolox_fast/tools/train.py, the tool an install runs as
`yolox_fast train ...` or `python -m yolox_fast.tools.train ...` (same flags)."""

from yolox_fast.core.cli import run_tool
from yolox_fast.tools.train import main

if __name__ == "__main__":
    run_tool(main)
