"""Ultralytics YOLO-format datasets: data.yaml parsing, image folders and lists, labels and their errors,
COCO-metric evaluation equal to the COCO original, and the tools on a YOLO set end to end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.datasets.synthetic import SHAPE_NAMES
from yolox_fast.data.datasets.yolo import (
    YOLODataset,
    image_size,
    label_path,
    val_image_dir,
    write_yolo_dataset,
    yolo_description,
)
from yolox_fast.data.description import read_description

REPO = Path(__file__).resolve().parents[1]
NAMES = ["cat", "dog"]


def _image(path: Path, h: int, w: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((h, w, 3), 90, np.uint8))


def _labels(root: Path, rel: str, text: str) -> Path:
    path = root / "labels" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _yaml(file: Path, **data) -> Path:
    file.write_text(yaml.safe_dump(data))
    return file


@pytest.fixture
def hand_set(tmp_path) -> Path:
    """A small YOLO set: train is a folder (one image in a sub-folder, two background images), val a
    .txt list; data.yaml without `path`."""
    root = tmp_path / "hand"
    _image(root / "images/train/a.jpg", 100, 200)
    _labels(root, "train/a.txt", "0 0.5 0.5 0.5 0.25\n\n1 0.25 0.25 0.1 0.2\n")
    _image(root / "images/train/sub/b.png", 64, 64)
    _labels(root, "train/sub/b.txt", "1 0.5 0.5 1 1\n")
    _image(root / "images/train/c.jpg", 50, 80)  # no label file: background
    _image(root / "images/train/d.jpg", 50, 80)
    _labels(root, "train/d.txt", "")  # empty label file: background
    _image(root / "images/val/v.jpg", 80, 80)
    _labels(root, "val/v.txt", "0 0.5 0.5 0.2 0.2\n")
    (root / "images/train/notes.md").write_text("not an image")
    (root / "val.txt").write_text("./images/val/v.jpg\n")
    _yaml(root / "data.yaml", train="images/train", val="val.txt", names=NAMES)
    return root


def _dataset(root: Path, split: str = "train", **kw) -> YOLODataset:
    cfg = read_description(root / "data.yaml")
    return YOLODataset(cfg["root"], cfg[split]["images"], cfg["class_names"], img_size=(64, 64), **kw)


# ------------------------------------------------------------------------------------------ data.yaml
def test_names_as_list_or_id_mapping(tmp_path):
    as_list = yolo_description(_yaml(tmp_path / "a.yaml", train="t", val="v", names=["cat", "dog"], nc=2))
    as_dict = yolo_description(_yaml(tmp_path / "b.yaml", train="t", val="v", names={1: "dog", 0: "cat"}))
    assert as_list["class_names"] == as_dict["class_names"] == ["cat", "dog"]
    assert as_list["format"] == "yolo" and as_list["train"] == {"images": ["t"]}
    assert as_list["root"] == str(tmp_path.resolve())  # no `path`: the yaml's folder
    listed = yolo_description(_yaml(tmp_path / "c.yaml", train=["t1", "t2"], val="v", names=["x"]))
    assert listed["train"]["images"] == ["t1", "t2"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"train": "t", "val": "v", "names": {1: "a", 2: "b"}}, r"must be 0\.\.1, got \[1, 2\]"),
        ({"train": "t", "val": "v", "names": ["a", "b"], "nc": 3}, "nc is 3 but names lists 2"),
        ({"train": "t", "val": "v"}, "lacks the key 'names'"),
        ({"train": "t", "names": ["a"]}, "lacks the key 'val'"),
        ({"train": 5, "val": "v", "names": ["a"]}, "train must be a path"),
    ],
)
def test_bad_data_yaml_is_an_error_naming_the_file(tmp_path, data, message):
    path = _yaml(tmp_path / "bad.yaml", **data)
    with pytest.raises(ValueError, match=message) as err:
        read_description(path)
    assert str(path) in str(err.value)


def test_relative_path_tries_yaml_folder_then_working_dir_then_datadir(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "beside").mkdir()
    (tmp_path / "work" / "in_cwd").mkdir(parents=True)
    (tmp_path / "store" / "in_datadir").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("YOLOX_DATADIR", str(tmp_path / "store"))
    for name, expected in [
        ("beside", conf / "beside"),
        ("in_cwd", tmp_path / "work" / "in_cwd"),
        ("in_datadir", tmp_path / "store" / "in_datadir"),
    ]:
        cfg = yolo_description(_yaml(conf / "d.yaml", path=name, train="t", val="v", names=["a"]))
        assert cfg["root"] == str(expected.resolve()), name
        assert cfg["name"] == name


# ------------------------------------------------------------------------------------------ reading
def test_label_path_swaps_the_last_images_folder():
    assert label_path("/d/images/x/images/train/a.b.jpg") == "/d/images/x/labels/train/a.b.txt"
    assert label_path("/d/pics/a.png") == "/d/pics/a.txt"  # no images/ folder: next to the image


def test_folder_split_with_background_images_and_pixel_boxes(hand_set, log_lines):
    ds = _dataset(hand_set)
    names = [os.path.relpath(r.file, hand_set) for r in ds.records]
    assert names == [
        "images/train/a.jpg",
        "images/train/c.jpg",
        "images/train/d.jpg",
        "images/train/sub/b.png",
    ]
    assert ds.ids == [0, 1, 2, 3]  # position in the split
    a, c, d, b = ds.records
    assert (a.height, a.width) == (100, 200)
    # cx 0.5 cy 0.5 w 0.5 h 0.25 of a 200x100 image; the empty line is skipped
    np.testing.assert_allclose(a.boxes, [[50, 37.5, 150, 62.5], [40, 15, 60, 35]])
    assert a.classes.tolist() == [0, 1]
    assert len(c.boxes) == len(d.boxes) == 0
    np.testing.assert_allclose(b.boxes, [[0, 0, 64, 64]])
    assert ds.class_names == tuple(NAMES) and ds.class_ids == [1, 2]
    assert any("1 files without an image extension" in line for line in log_lines)


def test_txt_list_lines_relative_to_root_or_absolute_and_lists_of_entries(hand_set):
    extra = hand_set / "extra" / "images" / "e.jpg"
    _image(extra, 40, 40)
    (hand_set / "extra" / "labels").mkdir()
    (hand_set / "extra" / "labels" / "e.txt").write_text("1 0.5 0.5 0.5 0.5\n")
    (hand_set / "val.txt").write_text(f"./images/val/v.jpg\n{extra}\n")
    _yaml(hand_set / "data.yaml", train=["images/train", "val.txt"], val="val.txt", names=NAMES)
    val = _dataset(hand_set, "val")
    assert [Path(r.file).name for r in val.records] == ["v.jpg", "e.jpg"]
    np.testing.assert_allclose(val.records[1].boxes, [[10, 10, 30, 30]])
    assert len(_dataset(hand_set, "train")) == 6


def test_polygon_lines_become_their_bounding_box(hand_set):
    _labels(hand_set, "train/a.txt", "1 0.1 0.2 0.6 0.2 0.4 0.9\n")
    np.testing.assert_allclose(_dataset(hand_set).records[0].boxes, [[20, 20, 120, 90]], atol=1e-4)


def test_coordinates_within_tolerance_are_clipped(hand_set):
    _labels(hand_set, "train/a.txt", "0 1.0005 0.5 0.5 0.25\n")
    box = _dataset(hand_set).records[0].boxes[0]
    assert box[0] == pytest.approx(150) and box[2] == 200  # x2 = 1.25 * 200 clipped to the image


@pytest.mark.parametrize(
    "line, message",
    [
        ("0 0.5 0.5 0.5", "4 values: neither a box"),
        ("0 0.5 0.5 0.5 0.5 0.5", "6 values: neither a box"),
        ("0 0.1 0.1 0.2 0.1 0.2 0.2 0.3", "8 values: neither a box"),
        ("0 0.5 abc 0.5 0.5", "'abc' is not a number"),
        ("0 0.5 nan 0.5 0.5", "'nan' is not a finite number"),
        ("2 0.5 0.5 0.5 0.5", r"class id 2 is not in 0\.\.1"),
        ("-1 0.5 0.5 0.5 0.5", r"class id -1 is not in 0\.\.1"),
        ("0.5 0.5 0.5 0.5 0.5", r"class id 0.5 is not in 0\.\.1"),
        ("0 1.2 0.5 0.5 0.5", r"coordinate 1.2 is outside \[0, 1\]"),
        ("0 0.5 0.5 0.5 -0.01", r"coordinate -0.01 is outside \[0, 1\]"),
    ],
)
def test_malformed_label_line_names_file_and_line(hand_set, line, message):
    path = _labels(hand_set, "train/a.txt", f"0 0.5 0.5 0.1 0.1\n{line}\n")
    with pytest.raises(ValueError, match=message) as err:
        _dataset(hand_set)
    assert f"{path}:2:" in str(err.value)


def test_skip_corrupt_skips_bad_lines_and_counts_them_in_one_warning(hand_set, log_lines):
    _labels(hand_set, "train/a.txt", "0 0.5 0.5 0.1 0.1\n7 0.5 0.5 0.5 0.5\n1 0.5 0.5 0.2 0.2\nx\n")
    ds = _dataset(hand_set, skip_corrupt=True)
    assert ds.records[0].classes.tolist() == [0, 1]  # the two good lines
    warnings = [line for line in log_lines if "bad label lines" in line]
    assert len(warnings) == 1 and "skipped 2 bad label lines" in warnings[0]
    assert f"{hand_set / 'labels/train/a.txt'}:2" in warnings[0]


def test_missing_listed_image_is_an_error_unless_skipped(hand_set):
    (hand_set / "val.txt").write_text("./images/val/v.jpg\n./images/val/gone.jpg\n")
    with pytest.raises(FileNotFoundError, match="gone.jpg"):
        _dataset(hand_set, "val")
    assert len(_dataset(hand_set, "val", skip_corrupt=True)) == 1


def test_missing_split_folder_is_an_error_naming_it(hand_set):
    _yaml(hand_set / "data.yaml", train="images/nope", val="val.txt", names=NAMES)
    with pytest.raises(FileNotFoundError, match="images/nope"):
        _dataset(hand_set)


def test_header_size_follows_exif_rotation_as_opencv_does(tmp_path):
    path = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    Image.fromarray(np.zeros((20, 40, 3), np.uint8)).save(path, exif=exif)
    assert image_size(str(path)) == cv2.imread(str(path)).shape[:2] == (40, 20)


def test_coco_view_of_the_labels(hand_set):
    coco = _dataset(hand_set).coco
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == NAMES
    anns = coco.loadAnns(coco.getAnnIds(imgIds=[0]))
    assert [a["category_id"] for a in anns] == [1, 2]
    assert anns[0]["bbox"] == pytest.approx([50, 37.5, 100, 25]) and anns[0]["area"] == pytest.approx(2500)
    assert min(a["id"] for a in coco.dataset["annotations"]) == 1


def test_val_image_dir_for_a_folder_or_a_list(hand_set):
    cfg = read_description(hand_set / "data.yaml")
    assert val_image_dir(cfg) == str(hand_set / "images" / "val")  # the common folder of the list
    _yaml(hand_set / "data.yaml", train="images/train", val="images/val", names=NAMES)
    assert val_image_dir(read_description(hand_set / "data.yaml")) == str(hand_set / "images" / "val")


# ------------------------------------------------------------------------------------------ COCO vs YOLO
@pytest.fixture(scope="module")
def yolo_copy(tiny_shapes_coco, tmp_path_factory) -> Path:
    """tiny_shapes_coco written in YOLO layout; returns its data.yaml."""
    cfg = read_description(tiny_shapes_coco["config"])
    splits = {s: COCODataset(cfg["root"], cfg[s]["images"], cfg[s]["ann"]) for s in ("train", "val")}
    return write_yolo_dataset(tmp_path_factory.mktemp("yolo") / "shapes_yolo", splits)


def test_written_yolo_set_reads_back_the_coco_boxes(tiny_shapes_coco, yolo_copy):
    data = yaml.safe_load(yolo_copy.read_text())
    assert data == {"train": "images/train", "val": "images/val", "nc": 6, "names": list(SHAPE_NAMES)}
    cfg = read_description(tiny_shapes_coco["config"])
    for split in ("train", "val"):
        coco = COCODataset(cfg["root"], cfg[split]["images"], cfg[split]["ann"])
        yolo = _dataset(yolo_copy.parent, split)
        assert len(coco) == len(yolo)
        for a, b in zip(coco.records, yolo.records):
            np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-3)  # 6 decimals of a 128 px side
            assert a.classes.tolist() == b.classes.tolist()


@pytest.mark.parametrize("noise", [False, True])
def test_ap_of_a_yolo_copy_equals_ap_of_the_coco_original(tiny_shapes_coco, yolo_copy, noise):
    from oracle_model import oracle_for, shapes_exp

    from yolox_fast.evaluators.build import build_evaluator
    from yolox_fast.evaluators.coco import COCOEvaluator

    coco_eval = build_evaluator(shapes_exp(tiny_shapes_coco["config"]), batch_size=3, is_distributed=False)
    yolo_eval = build_evaluator(shapes_exp(str(yolo_copy)), batch_size=3, is_distributed=False)
    assert isinstance(yolo_eval, COCOEvaluator)
    # the same detections for both: the oracle recognises images by their pixels (the files are shared)
    model, _ = oracle_for(coco_eval.dataloader.dataset, 6, (64, 96), noise=noise)
    coco_ap = coco_eval.evaluate(model)[:2]
    yolo_ap = yolo_eval.evaluate(model)[:2]
    if noise:
        assert 0.1 < coco_ap[0] < 0.99
    else:
        assert coco_ap == pytest.approx((1.0, 1.0))
    assert yolo_ap == pytest.approx(coco_ap, abs=1e-4)
    assert yolo_eval.last_result["num_images"] == tiny_shapes_coco["num_val"]


# ------------------------------------------------------------------------------------------ tools
def _run(*args, timeout=300):
    proc = subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_make_train_eval_demo_export_on_a_yolo_set(tmp_path):
    made = _run(
        REPO / "tools/make_dataset.py", "--format", "yolo", "--out", tmp_path / "shapes_yolo",
        "--num-train", 12, "--num-val", 4, "--size", 96,
    )  # fmt: skip
    data_yaml = tmp_path / "shapes_yolo" / "data.yaml"
    assert str(data_yaml) in made and not (tmp_path / "shapes_yolo.coco-source").exists()
    exp_file = REPO / "exps/example/custom_yolo.py"
    opts = [
        "dataset", data_yaml, "num_classes", 6, "output_dir", tmp_path, "input_size", "(64,64)",
        "test_size", "(64,64)", "random_size", "(2,2)", "data_num_workers", 0, "max_epoch", 1,
        "no_aug_epochs", 0, "warmup_epochs", 0, "eval_interval", 1, "print_interval", 1, "seed", 0,
    ]  # fmt: skip
    _run(REPO / "tools/train.py", "-f", exp_file, "-expn", "run", "-b", 2, "-l", "none", *opts)
    ckpt = tmp_path / "run" / "best_ckpt.pth"
    assert ckpt.is_file()

    evaluated = _run(REPO / "tools/eval.py", "-f", exp_file, "-expn", "run", "-c", ckpt, "-b", 2, *opts)
    assert "per class AP" in evaluated
    assert all(name in evaluated for name in SHAPE_NAMES)  # the data.yaml names reach the tables

    # no --path: the demo's default images are the YOLO set's val images
    _run(REPO / "tools/demo.py", "image", "-f", exp_file, "-expn", "run", "-c", ckpt, "--save-json", *opts)
    saved = list((tmp_path / "run" / "vis_res").rglob("detections.json"))  # the demo's (eval/ has its own)
    assert len(saved) == 1
    assert sorted(json.loads(saved[0].read_text())) == sorted(
        p.name for p in (data_yaml.parent / "images/val").iterdir()
    )

    onnx = tmp_path / "model.onnx"
    exported = _run(
        REPO / "tools/export_onnx.py", "-f", exp_file, "-c", ckpt, "--output-name", onnx, "--tsize", 64, *opts
    )
    assert onnx.is_file() and "max abs diff" in exported
