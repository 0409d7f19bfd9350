"""ONNX export round trip: onnxruntime gives PyTorch's outputs, raw or decoded, static or dynamic batch."""

import importlib.util
from pathlib import Path

import pytest
import torch

from yolox_fast.core.export import compare_with_onnxruntime, export_onnx
from yolox_fast.exp import get_exp

pytest.importorskip("onnxruntime")
REPO = Path(__file__).resolve().parents[1]


def _nano(num_classes=3):
    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = num_classes
    torch.manual_seed(0)
    return exp.get_model().eval()


def test_dynamic_batch_raw_outputs_round_trip(tmp_path):
    model = _nano()
    path = str(tmp_path / "nano.onnx")
    export_onnx(model, path, (64, 96), batch_size=1, dynamic=True, decode_in_inference=False)
    assert model.head.decode_in_inference is False
    # a batch of 3, not the traced 1
    images = torch.rand(3, 3, 64, 96, generator=torch.Generator().manual_seed(1)) * 255
    assert compare_with_onnxruntime(model, path, images) < 1e-4


def test_export_tool_static_decoded(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("export_tool", REPO / "tools" / "export_onnx.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "decoded.onnx"
    tool.main(
        [
            "-n",
            "yolox-nano",
            "--tsize",
            "64",
            "--batch-size",
            "2",
            "--decode-in-inference",
            "--output-name",
            str(out),
            "num_classes",
            "2",
        ]
    )
    assert out.is_file()
    printed = capsys.readouterr().out
    diff = float(printed.split("max abs diff:")[1].split()[0])
    assert diff < 1e-3  # decoded boxes are in pixels (exp of the raw wh), so the absolute error is larger
