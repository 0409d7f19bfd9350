"""Export a YOLOX checkpoint to ONNX (YOLOX's tool and flags), then check it against PyTorch: tools/export.py
--format onnx with YOLOX's default output name.

python tools/export_onnx.py -n yolox-s -c yolox_s.pth --output-name yolox_s.onnx
python tools/export_onnx.py -f exps/yolox_nano.py -c best_ckpt.pth --dynamic --decode-in-inference
"""

from __future__ import annotations

import argparse

from yolox_fast.core.cli import run_tool
from yolox_fast.tools import export


def make_parser() -> argparse.ArgumentParser:
    p = export.make_parser()
    p.prog = "yolox_fast onnx export"
    p.set_defaults(format="onnx", output_name="yolox.onnx")
    return p


def main(argv=None) -> str:
    return export.main(argv, make_parser())


if __name__ == "__main__":
    run_tool(main)
