"""`python tools/check_dataset.py ...` from a checkout runs yolox_fast/tools/check_dataset.py,
the tool an install runs as `yolox_fast check ...`
or `python -m yolox_fast.tools.check_dataset ...` (same flags)."""

from yolox_fast.core.cli import run_tool
from yolox_fast.tools.check_dataset import main

if __name__ == "__main__":
    run_tool(main)
