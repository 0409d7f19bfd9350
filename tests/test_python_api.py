"""The Python API (yolox_fast/api/): what predict reads, the Results it returns, the models it opens and
refuses, and every code block of docs/python.md run as written."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from helpers import REPO
from PIL import Image
from test_hub import server  # noqa: F401 -- the local weights server fixture

from yolox_fast import YOLOX, Results
from yolox_fast.api.sources import read_sources
from yolox_fast.exp import Exp, get_exp
from yolox_fast.utils import hub
from yolox_fast.utils.checkpoint import save_checkpoint

DOC = REPO / "docs" / "python.md"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """A folder of three small BGR images (two in a sub-folder) with known pixels."""
    root = tmp_path_factory.mktemp("imgs")
    (root / "sub").mkdir()
    rng = np.random.default_rng(0)
    for i, name in enumerate(["a.png", "sub/b.png", "sub/c.png"]):
        cv2.imwrite(str(root / name), rng.integers(0, 255, (40 + 8 * i, 56, 3), dtype=np.uint8))
    return root


def test_sources_read_paths_folders_globs_pil_and_arrays_in_bgr(images):
    a = cv2.imread(str(images / "a.png"))
    assert [Path(n).name for n, _ in read_sources(images)] == ["a.png"]  # the folder's own images
    folder = list(read_sources(images, recursive=True))
    assert [Path(n).name for n, _ in folder] == ["a.png", "b.png", "c.png"]
    assert [Path(n).name for n, _ in read_sources(str(images / "sub" / "*.png"))] == ["b.png", "c.png"]
    png = images / "a.png"
    (_, from_path), (_, from_array), (_, from_pil) = read_sources([png, a, Image.open(png)])
    for image in (from_array, from_pil):
        np.testing.assert_array_equal(image, from_path)
    ((_, rgb_read),) = read_sources(a[:, :, ::-1].copy(), color="rgb")
    np.testing.assert_array_equal(rgb_read, a)
    assert len(list(read_sources(np.stack([a, a])))) == 2  # (B, H, W, 3): B images
    gray = list(read_sources(a[:, :, 0]))[0][1]
    assert gray.shape == a.shape


def test_sources_say_what_they_cannot_read(images, tmp_path):
    with pytest.raises(FileNotFoundError, match="no file matches"):
        list(read_sources(str(tmp_path / "*.jpg")))
    (tmp_path / "bad.jpg").write_bytes(b"no image")
    with pytest.raises(ValueError, match="cannot read image .*bad.jpg"):
        list(read_sources(tmp_path / "bad.jpg"))
    with pytest.raises(ValueError, match="color"):
        list(read_sources(images, color="hsv"))
    with pytest.raises(TypeError, match="cannot read a int"):
        list(read_sources(3))


def test_results_plot_save_json_and_supervision(tmp_path):
    image = np.zeros((50, 60, 3), np.uint8)
    dets = np.array([[5.0, 6.0, 30.0, 40.0, 0.9, 1.0], [1.0, 2.0, 9.0, 9.0, 0.4, 0.0]])
    result = Results.from_detections(dets, ("cat", "dog"), image, "photo.jpg")
    assert len(result) == 2 and result.class_names == ["dog", "cat"] and result.class_ids.dtype == np.int64
    np.testing.assert_array_equal(result.detections, dets)
    assert result.plot().shape == image.shape and result.plot().any() and not image.any()
    assert Path(result.save(tmp_path / "out" / "p.png")).is_file()
    records = json.loads(result.to_json())
    assert records[0] == {"bbox": [5.0, 6.0, 30.0, 40.0], "score": 0.9, "class_id": 1, "class_name": "dog"}
    sv = pytest.importorskip("supervision")
    detections = result.to_supervision()
    assert isinstance(detections, sv.Detections) and list(detections.data["class_name"]) == ["dog", "cat"]
    np.testing.assert_allclose(detections.xyxy, dets[:, :4])
    with pytest.raises(ValueError, match="give save"):
        Results.from_detections(dets, ("cat", "dog"), image, None).save()


def _tiny_exp() -> Exp:
    exp = get_exp(None, "yolox-nano")
    exp.num_classes, exp.test_size, exp.class_names = 3, (64, 64), ("a", "b", "c")
    return exp


def test_a_model_without_weights_is_refused_unless_asked(images):
    with pytest.raises(ValueError, match="random_weights=True"):
        YOLOX(_tiny_exp()).predict(images)
    with pytest.raises(ValueError, match="random_weights=True"):
        YOLOX(_tiny_exp()).export()
    results = YOLOX(_tiny_exp(), random_weights=True).predict(images, conf=0.0, batch=2, recursive=True)
    assert [r.image.shape[:2] for r in results] == [(40, 56), (48, 56), (56, 56)]
    assert all(r.names == ("a", "b", "c") for r in results)


def test_predict_reads_a_folders_subfolders_only_when_asked(images, log_lines):
    model = YOLOX(_tiny_exp(), random_weights=True)
    assert [Path(r.path).name for r in model.predict(images)] == ["a.png"]
    (hint,) = [m for m in log_lines if "subfolders" in m]
    assert "2 images in its subfolders not read" in hint and "recursive=True" in hint
    every = model.predict(images, recursive=True)
    assert [Path(r.path).name for r in every] == ["a.png", "b.png", "c.png"]
    assert len([m for m in log_lines if "subfolders" in m]) == 1  # nothing left out: nothing said


def test_official_weights_need_an_exp_and_predict_as_the_predictor(images, tmp_path):
    exp = _tiny_exp()
    torch.manual_seed(0)
    save_checkpoint({"model": exp.get_model().state_dict()}, tmp_path / "official.pth")
    with pytest.raises(ValueError, match="stores no exp"):
        YOLOX(tmp_path / "official.pth")
    model = YOLOX(tmp_path / "official.pth", exp=exp)
    a = cv2.imread(str(images / "a.png"))
    (result,) = model.predict(a, conf=0.0, iou=0.5)
    predictor = model.predictor()
    predictor.conf, predictor.nms = 0.0, 0.5
    np.testing.assert_array_equal(result.detections, predictor.predict([a])[0])


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(FileNotFoundError, match="shapes-nano"):
        YOLOX("yolox-q")


@pytest.mark.slow
def test_every_code_block_of_the_python_docs_runs(tmp_path, monkeypatch, server):  # noqa: F811
    """docs/python.md's blocks in order, as a user pastes them: shell blocks in a fresh shell (the installed
    command is this checkout's `python -m yolox_fast`), Python blocks in one interpreter namespace."""
    base, served, _ = server
    coco_nano = get_exp(None, "yolox-nano")
    torch.save({"model": coco_nano.get_model().state_dict()}, served / "yolox_nano.pth")  # official layout
    monkeypatch.setenv(hub.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv(hub.MIRROR_ENV, base)
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```(python|bash)\n(.*?)```", DOC.read_text(), flags=re.S)
    assert [kind for kind, _ in blocks].count("python") >= 6
    namespace: dict = {}
    for kind, code in blocks:
        if kind == "bash":
            command = code.replace("yolox_fast ", f"{sys.executable} -m yolox_fast ")
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300, env=env)
            assert done.returncode == 0, f"{code}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        else:
            exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 -- the docs' code, as a user runs it
    assert namespace["metrics"].per_class.keys() == {"circle", "square", "triangle", "star", "cross", "ring"}
    assert Path(namespace["path"]).is_file() and (tmp_path / "first_pred.jpg").is_file()
    assert namespace["bigger"].exp.test_size == (160, 160) and len(namespace["coco"].names) == 80
