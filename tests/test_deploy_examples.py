"""The standalone deployment examples (examples/*_demo.py), run as an application runs them: in a virtual
environment with numpy, OpenCV and the runtime only (no torch, no yolox_fast), on a file exported with
`tools/export.py --nms`; they find the boxes `tools/demo.py -c FILE` finds on the same images."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, load_tool
from test_export import _lively_nano

NAMES = ["circle", "square", "triangle", "star", "cross", "ring"]
# what a deployment installs: no torch, and so nothing of yolox_fast can run
RUNTIME_PACKAGES = ["numpy", "opencv-python-headless", "onnxruntime", "openvino"]


@pytest.fixture(scope="session")
def torchless_python(tmp_path_factory) -> str:
    """The interpreter of a fresh virtual environment holding RUNTIME_PACKAGES only (made once a session;
    skipped where pip cannot reach a package index)."""
    venv = tmp_path_factory.mktemp("deploy_venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / ("Scripts" if sys.platform == "win32" else "bin") / "python")
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", *RUNTIME_PACKAGES], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"pip could not install {RUNTIME_PACKAGES} into a fresh venv: {done.stderr[-500:]}")
    no_torch = subprocess.run([python, "-c", "import torch"], capture_output=True)
    assert no_torch.returncode != 0, "the deployment venv must not have torch"
    return python


@pytest.mark.slow
@pytest.mark.parametrize("fmt, example", [("onnx", "onnxruntime_demo.py"), ("openvino", "openvino_demo.py")])
def test_example_without_torch_finds_the_demos_boxes(
    fmt, example, torchless_python, tiny_shapes_coco, tmp_path
):
    exp, model = _lively_nano(tiny_shapes_coco["config"], 64)
    ckpt = tmp_path / "lively.pth"
    torch.save({"model": model.state_dict(), "class_names": NAMES}, ckpt)
    data = ["num_classes", "6", "dataset", tiny_shapes_coco["config"], "output_dir", str(tmp_path)]
    path = tmp_path / ("model.onnx" if fmt == "onnx" else "model.xml")
    export = [
        "--format",
        fmt,
        "--dynamic",
        "--nms",
        "--nms-conf",
        "0.3",
        "--nms-iou",
        "0.3",
        "--nms-agnostic",
    ]
    load_tool("export").main(
        [*export, "-n", "yolox-nano", "-c", str(ckpt), "--tsize", "64", "--output-name", str(path), *data]
    )
    images = Path(tiny_shapes_coco["root"]) / "val2017"
    shown = ["--path", str(images), "--save-json", "output_dir", str(tmp_path), "-expn", "demo"]
    load_tool("demo").main(["image", "-c", str(path), *shown])
    (saved,) = (tmp_path / "demo" / "vis_res").glob("*/detections.json")
    expected = json.loads(saved.read_text())

    found_json, drawn = tmp_path / "example.json", tmp_path / "drawn"
    run = subprocess.run(
        [
            torchless_python,
            str(REPO / "examples" / example),
            str(path),
            str(images),
            "--json",
            str(found_json),
        ]
        + ["--out", str(drawn)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(found_json.read_text())
    assert found.keys() == expected.keys() and len(list(drawn.glob("*.jpg"))) == len(found)
    assert sum(map(len, expected.values())) > 0
    for image, dets in expected.items():
        mine = found[image]
        assert [d["class_id"] for d in mine] == [d["class_id"] for d in dets], image
        # the same graph on the same letterbox: equal up to the JSON's rounding (0.01 px, 1e-5 score), and
        # the venv's OpenCV build, whose bilinear resize may round a pixel otherwise
        np.testing.assert_allclose([d["bbox"] for d in mine], [d["bbox"] for d in dets], atol=0.05)
        np.testing.assert_allclose([d["score"] for d in mine], [d["score"] for d in dets], atol=1e-4)
