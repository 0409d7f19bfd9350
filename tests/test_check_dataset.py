"""tools/check_dataset.py: a clean set passes with both pictures written; every planted problem is named
(not only the first); COCO (description and data_dir), VOC and YOLO sets are read; exit code 1 on errors."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import run_tool_here
from PIL import Image

from yolox_fast.data.check import check_dataset
from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.datasets.synthetic import SHAPE_NAMES
from yolox_fast.data.datasets.yolo import write_yolo_dataset
from yolox_fast.data.description import read_description
from yolox_fast.exp import Exp

REPO = Path(__file__).resolve().parents[1]
SMALL = ["input_size", "(128,128)"]


def _check(*args):
    """`python tools/check_dataset.py args...` as typed, in this process (helpers.run_tool_here)."""
    return run_tool_here("check_dataset", *args)


def _exp(description: str, **fields) -> Exp:
    exp = Exp()
    exp.dataset = description
    exp.num_classes = 6
    exp.input_size = (128, 128)
    for k, v in fields.items():
        setattr(exp, k, v)
    return exp


def _copy(tiny_shapes_coco, dst: Path) -> Path:
    shutil.copytree(tiny_shapes_coco["root"], dst)
    desc = json.loads((dst / "dataset.json").read_text())
    desc["root"] = str(dst)
    (dst / "dataset.json").write_text(json.dumps(desc))
    return dst


@pytest.fixture
def planted(tiny_shapes_coco, tmp_path) -> dict:
    """A copy of the tiny COCO set with one of each problem planted; returns what names each."""
    root = _copy(tiny_shapes_coco, tmp_path / "planted")
    train_file = root / "annotations" / "instances_train2017.json"
    val_file = root / "annotations" / "instances_val2017.json"
    train, val = json.loads(train_file.read_text()), json.loads(val_file.read_text())
    anns = train["annotations"]
    by_image = {}
    for a in anns:
        by_image.setdefault(a["image_id"], []).append(a)
    (root / "train2017" / "000002.jpg").unlink()  # missing image
    image5, image6 = by_image[5], by_image[6]
    image5[0]["category_id"] = 99  # unknown category id
    image6[0]["category_id"] = 42  # a second one: all are listed, not only the first
    image5[1]["bbox"][2] = 0  # zero-size box
    image6[1]["bbox"][0] = 120  # reaches outside the 128 px image
    image6[1]["bbox"][2] = 30
    anns.append({**by_image[7][0], "id": 5000})  # duplicate box
    anns.append(
        {"id": 5001, "image_id": 999, "category_id": 1, "bbox": [1, 1, 9, 9], "area": 81, "iscrowd": 0}
    )
    train_file.write_text(json.dumps(train))
    val["annotations"] = [a for a in val["annotations"] if a["category_id"] != 6]  # 'ring' only in train
    val_file.write_text(json.dumps(val))
    (root / "val2017" / "000003.jpg").write_bytes(b"not a jpeg")  # undecodable
    return {
        "config": str(root / "dataset.json"),
        "missing": str(root / "train2017" / "000002.jpg"),
        "unknown": [
            f"annotation id {image5[0]['id']} has category id 99",
            f"annotation id {image6[0]['id']}",
        ],
        "zero": f"annotation id {image5[1]['id']} (000005.jpg)",
        "outside": f"annotation id {image6[1]['id']} (000006.jpg)",
        "duplicate": str(root / "train2017" / "000007.jpg"),
        "orphan": "annotation id 5001 names image id 999",
        "undecodable": str(root / "val2017" / "000003.jpg"),
    }


def _assert_pictures(folder: Path) -> None:
    for name in ("labels.png", "train_batch.png"):
        img = np.asarray(Image.open(folder / name).convert("RGB"))
        assert min(img.shape[:2]) > 500, name
        assert img.std() > 20, f"{name} looks blank"


# ------------------------------------------------------------------------------------------ in process
def test_clean_set_has_no_problems_and_counts_everything(tiny_shapes_coco, tmp_path):
    report = check_dataset(_exp(tiny_shapes_coco["config"]), tmp_path, samples=4)
    assert report.errors == report.warnings == 0, report.format()
    cfg = read_description(tiny_shapes_coco["config"])
    for split in ("train", "val"):
        truth = COCODataset(cfg["root"], cfg[split]["images"], cfg[split]["ann"])
        summary = report.summaries[split]
        assert summary.images == len(truth)
        assert summary.boxes == sum(len(r.boxes) for r in truth.records)
        expected = np.bincount(np.concatenate([r.classes for r in truth.records]), minlength=6)
        assert summary.per_class.tolist() == expected.tolist()
    text = report.format()
    assert all(name in text for name in SHAPE_NAMES) and "0 errors, 0 warnings" in text
    assert sorted(Path(p).name for p in report.written) == ["labels.png", "train_batch.png"]
    _assert_pictures(tmp_path)


def test_every_planted_problem_is_reported_by_kind(planted, tmp_path):
    report = check_dataset(_exp(planted["config"]), tmp_path, samples=4)
    train, val, both = (report.problems[s] for s in ("train", "val", "both"))
    assert train.count("unknown category id") == 2
    for kind in (
        "missing image",
        "zero-size box",
        "box outside its image",
        "duplicate box",
        "orphan annotation",
    ):
        assert train.count(kind) == 1, kind
    assert val.count("unreadable image") == 1
    assert both.count("class in one split only") == 1
    assert report.errors == 5 and report.warnings == 4
    # training still stops at the first error, with the same message
    cfg = read_description(planted["config"])
    with pytest.raises(ValueError, match="has category id 99"):
        COCODataset(cfg["root"], cfg["train"]["images"], cfg["train"]["ann"])


def test_would_drop_max_labels_and_num_classes_follow_the_exp(tiny_shapes_coco, tmp_path):
    exp = _exp(tiny_shapes_coco["config"], box_min_size=20.0, max_labels=5, num_classes=4)
    report = check_dataset(exp, tmp_path, samples=4)
    sizes = report.summaries["train"].sizes
    assert report.summaries["train"].would_drop == int((sizes.min(1) <= 20).sum()) > 0
    assert (
        report.problems["train"].count("box box_candidates would drop")
        == report.summaries["train"].would_drop
    )
    assert report.problems["train"].count("more boxes than max_labels") > 0
    assert report.problems["both"].count("more classes than exp.num_classes") == 1
    # box sizes are measured at the input size: 128 px images in a 64 px input halve them
    half = check_dataset(_exp(tiny_shapes_coco["config"], input_size=(64, 64)), tmp_path, samples=4)
    np.testing.assert_allclose(half.summaries["train"].sizes, report.summaries["train"].sizes / 2)


def test_synthetic_description_is_generated_before_checking(tmp_path):
    desc = {
        "name": "mini",
        "format": "coco",
        "root": str(tmp_path / "mini"),
        "train": {"images": "train2017", "ann": "instances_train2017.json"},
        "val": {"images": "val2017", "ann": "instances_val2017.json"},
        "class_names": list(SHAPE_NAMES),
        "synthetic": {"num_train": 6, "num_val": 3, "size": 64},
    }
    (tmp_path / "mini.json").write_text(json.dumps(desc))
    report = check_dataset(_exp(str(tmp_path / "mini.json")), tmp_path / "out", samples=2)
    assert report.summaries["train"].images == 6 and report.errors == 0


def test_yolo_label_errors_name_file_and_line_and_all_are_listed(tiny_shapes_coco, tmp_path):
    cfg = read_description(tiny_shapes_coco["config"])
    splits = {s: COCODataset(cfg["root"], cfg[s]["images"], cfg[s]["ann"]) for s in ("train", "val")}
    data_yaml = write_yolo_dataset(tmp_path / "y", splits)
    first, second = sorted((tmp_path / "y" / "labels" / "train").iterdir())[:2]
    first.write_text(first.read_text() + "9 0.5 0.5 0.1 0.1\n")
    second.write_text("0 0.5 0.5\n" + second.read_text())
    third = sorted((tmp_path / "y" / "images" / "train").iterdir())[2]
    third.unlink()  # its label file is left without an image
    report = check_dataset(_exp(str(data_yaml)), tmp_path / "out", samples=2)
    text = report.format()
    lines = len(first.read_text().splitlines())
    assert f"{first}:{lines}: class id 9 is not in 0..5" in text
    assert f"{second}:1: 3 values: neither a box" in text
    assert report.errors == 2
    assert (
        report.problems["train"]
        .first("label file without an image")
        .startswith(str(tmp_path / "y" / "labels" / "train" / f"{third.stem}.txt"))
    )


def test_voc_problems_are_all_listed(tiny_shapes_voc, tmp_path):
    root = tmp_path / "voc"
    shutil.copytree(tiny_shapes_voc["root"], root)
    desc = json.loads((root / "dataset.json").read_text())
    (root / "dataset.json").write_text(json.dumps({**desc, "root": str(root)}))
    annotations = sorted((root / "VOC2007" / "Annotations").glob("train_*.xml"))
    annotations[0].unlink()
    for xml in annotations[1:3]:
        xml.write_text(xml.read_text().replace("<name>", "<name>x", 1))
    annotations[3].write_text("<annotation>")
    report = check_dataset(_exp(str(root / "dataset.json")), tmp_path / "out", samples=2)
    train = report.problems["train"]
    assert train.count("missing annotation") == 1 and str(annotations[0]) in train.first("missing annotation")
    assert train.count("unknown class") == 2 and "object #0 has class 'x" in train.first("unknown class")
    assert train.count("malformed annotation") == 1 and "not valid XML" in train.first("malformed annotation")
    assert report.summaries["train"].images == tiny_shapes_voc["num_train"] - 2


# ------------------------------------------------------------------------------------------ the tool
@pytest.mark.slow
def test_tool_names_every_planted_problem_and_exits_1(planted, tmp_path):
    proc = _check("--dataset", planted["config"], "--output", tmp_path, "--samples", 4, *SMALL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    for key in ("missing", "zero", "outside", "duplicate", "orphan", "undecodable"):
        assert planted[key] in out, key
    assert all(u in out for u in planted["unknown"])
    assert "class 5 'ring': " in out and "no val boxes" in out
    assert "ERROR   [train] unknown category id: 2" in out and "5 errors, 4 warnings" in out
    assert (tmp_path / "labels.png").is_file()
    assert "train_batch.png not written" in out  # training itself would stop on the unknown category


@pytest.mark.slow
def test_tool_on_an_exp_with_data_dir(tiny_shapes_coco, tmp_path):
    proc = _check(
        "-f", REPO / "exps/example/custom_coco.py", "--samples", 4, "data_dir", tiny_shapes_coco["root"],
        "num_classes", 6, "output_dir", tmp_path, *SMALL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "circle" in proc.stdout  # names from the annotation categories
    assert "0 errors, 0 warnings" in proc.stdout
    out = tmp_path / "custom_coco" / "dataset_check"
    assert f"to {out}" in proc.stdout
    _assert_pictures(out)


@pytest.mark.slow
def test_tool_on_voc_and_yolo_sets(tiny_shapes_coco, tiny_shapes_voc, tmp_path):
    voc = _check("--dataset", tiny_shapes_voc["config"], "--output", tmp_path / "voc", "--samples", 4, *SMALL)
    assert voc.returncode == 0, voc.stdout + voc.stderr
    assert "tiny_shapes_voc (voc" in voc.stdout and "0 errors" in voc.stdout
    cfg = read_description(tiny_shapes_coco["config"])
    splits = {s: COCODataset(cfg["root"], cfg[s]["images"], cfg[s]["ann"]) for s in ("train", "val")}
    data_yaml = write_yolo_dataset(tmp_path / "shapes_yolo", splits)
    val_images = sorted((tmp_path / "shapes_yolo" / "images" / "val").iterdir())
    (tmp_path / "shapes_yolo" / "val.txt").write_text(
        "".join(f"{p}\n" for p in val_images) + "images/val/gone.jpg\n"
    )
    val_images[0].unlink()  # listed in val.txt: missing; its label file now belongs to no image
    data_yaml.write_text(yaml.safe_dump({**yaml.safe_load(data_yaml.read_text()), "val": "val.txt"}))
    yolo = _check("--dataset", data_yaml, "--samples", 4, "output_dir", tmp_path, *SMALL)
    assert yolo.returncode == 1, yolo.stdout + yolo.stderr
    assert "shapes_yolo (yolo" in yolo.stdout
    assert "ERROR   [val] missing image: 2" in yolo.stdout
    assert str(val_images[0]) in yolo.stdout and "gone.jpg" in yolo.stdout
    assert (tmp_path / "shapes_yolo" / "dataset_check" / "labels.png").is_file()


def test_tool_in_process_on_a_clean_set_exits_0(tiny_shapes_coco, tmp_path, capsys):
    from yolox_fast.tools import check_dataset

    with pytest.raises(SystemExit) as stop:
        check_dataset.main(["--dataset", tiny_shapes_coco["config"], "--headers-only",
                            "--output", str(tmp_path), "--samples", "2", *SMALL])  # fmt: skip
    assert stop.value.code == 0
    assert "0 errors" in capsys.readouterr().out
    assert (tmp_path / "labels.png").is_file() and (tmp_path / "train_batch.png").is_file()
