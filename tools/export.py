"""`python tools/export.py ...` from a checkout runs yolox_fast/tools/export.py, the tool an install runs as
`yolox_fast export ...` or `python -m yolox_fast.tools.export ...` (same flags)."""

from yolox_fast.core.cli import run_tool
from yolox_fast.tools.export import main

if __name__ == "__main__":
    run_tool(main)
