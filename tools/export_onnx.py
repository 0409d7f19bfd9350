"""`python tools/export_onnx.py ...` from a checkout runs yolox_fast/tools/export_onnx.py,
the tool an install runs as `yolox_fast export-onnx ...`
or `python -m yolox_fast.tools.export_onnx ...` (same flags)."""

from yolox_fast.core.cli import run_tool
from yolox_fast.tools.export_onnx import main

if __name__ == "__main__":
    run_tool(main)
