"""The folder layouts users bring, read as they are: a VOC folder of any name, LabelImg / CVAT XML output with
no split lists (split by CSV, list or val_ratio), Roboflow's COCO and Pascal VOC exports; each by a
description and by pointing `dataset` at the folder, with the bad input of these layouts named; and each
walked through the tools (check, train, eval, demo) as a user types them: the LabelImg folder from fresh
processes, the others run as the interpreter runs them, in this process (the same code, without three
seconds of interpreter start per tool)."""

import argparse
import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import exp_for, run_tool_in_process, run_tool_process

from yolox_fast.core.cli import build_exp
from yolox_fast.data import build
from yolox_fast.data.build import build_eval_dataset, build_train_dataset, dataset_config
from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.datasets.synthetic import SHAPE_NAMES
from yolox_fast.data.datasets.voc import VOCDetection, ratio_split
from yolox_fast.data.description import read_description
from yolox_fast.evaluators.build import build_evaluator
from yolox_fast.evaluators.coco import COCOEvaluator
from yolox_fast.evaluators.voc import VOCEvaluator

REPO = Path(__file__).resolve().parents[1]
SHAPES_EXP = str(REPO / "exps" / "example" / "shapes_nano.py")
FINETUNE_EXP = str(REPO / "exps" / "example" / "finetune_nano.py")


def _boxes(dataset) -> dict[str, list]:
    """Image file name -> its boxes and class names, to compare two readings of one set."""
    return {
        Path(r.file).name: [
            (*b, dataset.class_names[c]) for b, c in zip(r.boxes.tolist(), r.classes.tolist())
        ]
        for r in dataset.records
    }


def labelimg_folder(tiny_shapes_voc, dst: Path, beside: bool = False) -> Path:
    """LabelImg's output: images/ and annotations/ (or the XML beside the images), no split lists."""
    src = Path(tiny_shapes_voc["root"]) / "VOC2007"
    shutil.copytree(src / "JPEGImages", dst / "images")
    shutil.copytree(src / "Annotations", dst / ("images" if beside else "annotations"), dirs_exist_ok=True)
    return dst


def voc_folder(tiny_shapes_voc, dst: Path) -> Path:
    """A VOC folder named as the user named it (Annotations/, JPEGImages/, ImageSets/Main/)."""
    shutil.copytree(Path(tiny_shapes_voc["root"]) / "VOC2007", dst)
    return dst


def roboflow_coco(tiny_shapes_coco, dst: Path) -> Path:
    """Roboflow's COCO export: train/ and valid/ each holding its images and _annotations.coco.json, with
    the extra category 0 (the dataset's name, the supercategory of every class) that no box uses."""
    src = Path(tiny_shapes_coco["root"])
    for part, images, ann in (("train", "train2017", "train"), ("valid", "val2017", "val")):
        shutil.copytree(src / images, dst / part)
        data = json.loads((src / "annotations" / f"instances_{ann}2017.json").read_text())
        data["categories"] = [{"id": 0, "name": "shapes-xyz", "supercategory": "none"}] + [
            {**c, "supercategory": "shapes-xyz"} for c in data["categories"]
        ]
        (dst / part / "_annotations.coco.json").write_text(json.dumps(data))
    return dst


def roboflow_voc(tiny_shapes_voc, dst: Path) -> Path:
    """Roboflow's Pascal VOC export: train/ and valid/, each image beside its XML file."""
    src = Path(tiny_shapes_voc["root"]) / "VOC2007"
    for part, prefix in (("train", "train_"), ("valid", "val_")):
        (dst / part).mkdir(parents=True)
        for xml in sorted((src / "Annotations").glob(f"{prefix}*.xml")):
            shutil.copy(xml, dst / part)
            shutil.copy(src / "JPEGImages" / f"{xml.stem}.jpg", dst / part)
    return dst


def _voc_devkit(tiny_shapes_voc, split: str) -> VOCDetection:
    cfg = read_description(tiny_shapes_voc["config"])
    return VOCDetection(cfg["root"], cfg[split], cfg["class_names"])


# ------------------------------------------------------------------------------------------ reading
def test_a_voc_folder_of_any_name_reads_as_the_vocdevkit_form(tiny_shapes_voc, tmp_path):
    root = voc_folder(tiny_shapes_voc, tmp_path / "cats_2024")
    desc = tmp_path / "cats.json"
    desc.write_text(
        json.dumps(
            {
                "name": "cats",
                "format": "voc",
                "root": str(root),
                "train": {"list": "ImageSets/Main/train.txt"},
                "val": {"list": "ImageSets/Main/val.txt"},
            }
        )
    )
    for dataset in (str(desc), str(root)):  # the description, and the folder itself
        cfg = read_description(dataset)
        assert cfg["class_names"] == sorted(SHAPE_NAMES)  # from the XML files: no list was given
        for split in ("train", "val"):
            ours = VOCDetection(cfg["root"], cfg[split], SHAPE_NAMES)
            assert _boxes(ours).keys() == _boxes(_voc_devkit(tiny_shapes_voc, split)).keys()
            assert _boxes(ours) == _boxes(_voc_devkit(tiny_shapes_voc, split))


def test_labelimg_output_is_split_by_val_ratio_the_same_way_every_time(tiny_shapes_voc, tmp_path, log_lines):
    root = labelimg_folder(tiny_shapes_voc, tmp_path / "my_set")
    exp = exp_for(str(root))  # the folder itself: XML files and images, no split lists
    train, val = build_train_dataset(exp), build_eval_dataset(exp)
    names_train, names_val = set(_boxes(train)), set(_boxes(val))
    total = tiny_shapes_voc["num_train"] + tiny_shapes_voc["num_val"]
    assert not names_train & names_val and len(names_train | names_val) == total
    assert len(names_val) == round(0.2 * total)
    assert any(
        f"{total} annotated images split by val_ratio 0.2" in m and f"{len(names_val)} val" in m
        for m in log_lines
    )
    # the same images are the validation set in another process, on another day: a pure function of names
    again = build_eval_dataset(exp_for(str(root)))
    assert set(_boxes(again)) == names_val
    # and adding images keeps every old validation image there but those the new ones outrank
    stems = [Path(n).stem for n in sorted(names_train | names_val)]
    _, val_more = ratio_split(stems + [f"new_{i}" for i in range(10)], 0.2, 0)
    old_val = {Path(n).stem for n in names_val}
    assert len(old_val - set(val_more)) <= 2


def test_labelimg_output_split_by_a_csv_or_a_list(tiny_shapes_voc, tmp_path):
    root = labelimg_folder(tiny_shapes_voc, tmp_path / "raccoons", beside=True)
    files = sorted(p.name for p in (root / "images").glob("*.jpg"))
    (root / "data").mkdir()
    with open(root / "data" / "val_labels.csv", "w", newline="") as f:  # one row per box, as CSV exports
        writer = csv.writer(f)
        writer.writerow(["filename", "width", "height", "class", "xmin", "ymin", "xmax", "ymax"])
        for name in files[:5]:
            writer.writerows([[name, 128, 128, "circle", 1, 1, 9, 9]] * 2)
    (root / "train.txt").write_text("\n".join(Path(n).stem for n in files[5:]) + "\n")
    desc = tmp_path / "raccoons.json"
    desc.write_text(
        json.dumps(
            {
                "name": "raccoons",
                "format": "voc",
                "root": str(root),
                "images": "images",
                "annotations": "images",
                "train": {"list": "train.txt"},
                "val": {"csv": "data/val_labels.csv"},
                "class_names": list(SHAPE_NAMES),
            }
        )
    )
    exp = exp_for(str(desc))
    assert sorted(_boxes(build_eval_dataset(exp))) == files[:5]
    assert sorted(_boxes(build_train_dataset(exp))) == files[5:]


def test_roboflow_coco_export_without_its_unused_supercategory(tiny_shapes_coco, tmp_path, log_lines):
    root = roboflow_coco(tiny_shapes_coco, tmp_path / "shapes-xyz.v1i.coco")
    cfg = read_description(str(root))
    assert cfg["class_names"] == list(SHAPE_NAMES)  # category 0 is not a class
    train = COCODataset(cfg["root"], cfg["train"]["images"], cfg["train"]["ann"])
    assert train.class_names == tuple(SHAPE_NAMES) and train.class_ids == [1, 2, 3, 4, 5, 6]
    assert len(train) == tiny_shapes_coco["num_train"]
    assert any("(0, 'shapes-xyz')" in m and "not trained" in m for m in log_lines)
    exp = exp_for(str(root))
    assert len(build_eval_dataset(exp)) == tiny_shapes_coco["num_val"]
    assert isinstance(exp.get_evaluator(2, False), COCOEvaluator)


def test_roboflow_voc_export(tiny_shapes_voc, tmp_path):
    root = roboflow_voc(tiny_shapes_voc, tmp_path / "export")
    exp = exp_for(str(root))
    assert len(build_train_dataset(exp)) == tiny_shapes_voc["num_train"]
    assert _boxes(build_eval_dataset(exp)) == _boxes(_voc_devkit(tiny_shapes_voc, "val"))


def test_xml_sets_are_scored_with_the_coco_metric_vocdevkit_with_its_own(tiny_shapes_voc, tmp_path):
    root = labelimg_folder(tiny_shapes_voc, tmp_path / "mine")
    xml = next((root / "annotations").glob("val_*.xml"))
    xml.write_text(xml.read_text().replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1))
    assert isinstance(exp_for(tiny_shapes_voc["config"]).get_evaluator(2, False), VOCEvaluator)
    evaluator = exp_for(str(root)).get_evaluator(2, False)
    assert isinstance(evaluator, COCOEvaluator)
    coco = evaluator.dataloader.dataset.coco
    boxes = sum(len(r.boxes) for r in evaluator.dataloader.dataset.records)
    assert len(coco.dataset["annotations"]) == boxes
    # a difficult box is a crowd box there: COCOeval ignores it as the devkit ignores difficult ones
    assert sum(a["iscrowd"] for a in coco.dataset["annotations"]) == (
        xml.stem in {Path(r.file).stem for r in evaluator.dataloader.dataset.records}
    )


def test_data_dir_on_a_voc_description_takes_the_sets_own_class_names(tiny_shapes_voc, tmp_path):
    root = tmp_path / "VOCdevkit"
    shutil.copytree(tiny_shapes_voc["root"], root)
    exp = exp_for("voc", data_dir=str(root))
    exp.dataset = tiny_shapes_voc["config"]
    cfg = dataset_config(exp)
    assert cfg["class_names"] == sorted(SHAPE_NAMES) and cfg["root"] == str(root)


def test_a_run_reads_its_description_once_and_a_copy_with_other_data_its_own(
    tiny_shapes_voc, tmp_path, monkeypatch, log_lines
):
    """What a training start builds (the synthetic-set check, both splits, the evaluator, the class names)
    shares one read of the description, and a folder's description is logged once; an exp copied by the
    command line's overrides onto another data_dir reads that one, and the original keeps its own."""
    reads = []
    monkeypatch.setattr(
        build, "read_description", lambda *a, **k: reads.append(a) or read_description(*a, **k)
    )
    root = labelimg_folder(tiny_shapes_voc, tmp_path / "my_set")
    exp = exp_for(str(root))
    exp.prepare_dataset()
    build_train_dataset(exp)
    build_eval_dataset(exp)
    build_evaluator(exp, 2, False)
    exp.get_class_names()
    dataset_config(exp)["root"] = "changed by a caller"  # each call's copy is the caller's own
    assert len(reads) == 1 and dataset_config(exp)["root"] == str(root)
    assert sum("read as LabelImg" in m for m in log_lines) == 1

    other_root = labelimg_folder(tiny_shapes_voc, tmp_path / "other_set")
    args = argparse.Namespace(
        opts=["data_dir", str(other_root)], experiment_name=None, exp_file=None, name=None
    )
    copied = build_exp(args, exp=exp)
    assert dataset_config(copied)["root"] == str(other_root) and dataset_config(exp)["root"] == str(root)
    assert len(reads) == 2


# ------------------------------------------------------------------------------------------ bad input
def test_an_xml_naming_a_missing_image_names_both(tiny_shapes_voc, tmp_path):
    root = labelimg_folder(tiny_shapes_voc, tmp_path / "mine")
    (root / "images" / "train_000003.jpg").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"train_000003.xml names the image 'train_000003.jpg'.*images"
    ):
        build_train_dataset(exp_for(str(root), class_names=tuple(SHAPE_NAMES)))


def test_an_unknown_class_name_names_the_file(tiny_shapes_voc, tmp_path):
    root = voc_folder(tiny_shapes_voc, tmp_path / "mine")
    xml = root / "Annotations" / "train_000001.xml"
    xml.write_text(xml.read_text().replace("<name>", "<name>hexagon_", 1))
    with pytest.raises(ValueError, match=r"train_000001.xml: object #0 has class 'hexagon_"):
        build_train_dataset(exp_for(str(root), class_names=tuple(SHAPE_NAMES)))


def test_a_box_with_no_area_is_named_when_dropped(tiny_shapes_voc, tmp_path, log_lines):
    root = labelimg_folder(tiny_shapes_voc, tmp_path / "mine")
    xml = root / "annotations" / "train_000002.xml"
    text = xml.read_text()
    xmin = text.split("<xmin>")[1].split("<")[0]
    xml.write_text(
        text.replace(f"<xmax>{text.split('<xmax>')[1].split('<')[0]}<", f"<xmax>{int(xmin) - 1}<", 1)
    )
    build_train_dataset(exp_for(str(root), class_names=tuple(SHAPE_NAMES)))
    assert any("no area" in m and "train_000002.xml object #0" in m for m in log_lines)


def test_a_coco_export_whose_images_are_elsewhere_says_where_it_looked(tiny_shapes_coco, tmp_path):
    root = roboflow_coco(tiny_shapes_coco, tmp_path / "export")
    for image in (root / "train").glob("*.jpg"):
        image.rename(tmp_path / image.name)
    with pytest.raises(FileNotFoundError, match=r"none of the \d+ images .* is in .*export/train"):
        build_train_dataset(exp_for(str(root)))


def test_a_folder_of_no_known_layout_says_what_was_looked_for(tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("hello")
    with pytest.raises(FileNotFoundError, match="matches no layout.*data.yaml.*_annotations.coco.json"):
        read_description(str(tmp_path / "stuff"))


def test_a_val_ratio_beside_split_lists_is_refused(tmp_path):
    desc = tmp_path / "d.json"
    desc.write_text(json.dumps({"name": "d", "format": "voc", "root": str(tmp_path), "val_ratio": 0.2,
                                "train": {}, "val": {}}))  # fmt: skip
    with pytest.raises(ValueError, match="either val_ratio"):
        read_description(str(desc))


# ------------------------------------------------------------------------------------------ journeys
TINY = ["input_size", "(64,64)", "test_size", "(64,64)", "random_size", "(2,2)", "data_num_workers", "0",
        "max_epoch", "1", "no_aug_epochs", "0", "warmup_epochs", "0", "seed", "0"]  # fmt: skip


def _journey(
    dataset: str,
    out: Path,
    images: Path,
    cwd: Path,
    exp: str = SHAPES_EXP,
    *flags: str,
    run=run_tool_in_process,
) -> str:
    """check -> train one short epoch (`flags`: e.g. -c weights) -> eval -> demo on `dataset` as typed, each
    tool through `run` (`run_tool_process`: a fresh process each)."""
    check = run("check_dataset", "--dataset", dataset, "--output", str(out / "check"), cwd=cwd)
    assert "0 errors" in check, check[-3000:]
    name = Path(exp).stem
    args = ["-f", exp, "dataset", dataset, "output_dir", str(out), *TINY]
    train = run("train", *args[:2], "-b", "2", "-l", "none", *flags, *args[2:], cwd=cwd)
    assert (out / name / "best_ckpt.pth").is_file(), train[-3000:]
    evaluated = run("eval", *args, "-b", "4", cwd=cwd)
    assert "Average Precision" in evaluated and "| circle" in evaluated, evaluated[-3000:]
    run("demo", "image", *args, "--path", str(images), "--save-json", "-b", "4", cwd=cwd)
    saved = sorted((out / name / "vis_res").glob("*/detections.json"))
    assert saved and len(json.loads(saved[-1].read_text())) == len(list(images.glob("*.jpg")))
    return train


@pytest.mark.slow
def test_journey_labelimg_folder_as_it_is_fine_tuned_by_the_example_exp(tiny_shapes_voc, tmp_path):
    """The fine-tuning example as its docstring says to run it: -c COCO-style weights (80 classes, BatchNorm
    folded), dataset = the folder LabelImg wrote; the class count comes from the data."""
    from test_finetune import save_folded_coco_nano

    root = labelimg_folder(tiny_shapes_voc, tmp_path / "my labelled photos")
    weights = tmp_path / "yolox_nano.pth"
    save_folded_coco_nano(weights)
    out, images = tmp_path / "out", root / "images"
    train = _journey(str(root), out, images, tmp_path, FINETUNE_EXP, "-c", str(weights), run=run_tool_process)
    assert train.count("read as LabelImg") == 1 and "split by val_ratio 0.2" in train  # one read a run
    assert "re-estimated them on" in train and "6: circle" in train


@pytest.mark.slow
def test_journey_roboflow_coco_export_as_it_is(tiny_shapes_coco, tmp_path):
    root = roboflow_coco(tiny_shapes_coco, tmp_path / "shapes.v2i.coco")
    train = _journey(str(root), tmp_path / "out", root / "valid", tmp_path)
    assert "classes           6: circle" in train or "6: circle" in train


@pytest.mark.slow
def test_journey_voc_folder_of_any_name_through_a_description(tiny_shapes_voc, tmp_path):
    root = voc_folder(tiny_shapes_voc, tmp_path / "cats_2024")
    desc = tmp_path / "cats.json"
    desc.write_text(json.dumps({"name": "cats", "format": "voc", "root": str(root),
                                "train": {"list": "ImageSets/Main/train.txt"},
                                "val": {"list": "ImageSets/Main/val.txt"}}))  # fmt: skip
    _journey(str(desc), tmp_path / "out", root / "JPEGImages", tmp_path)


def test_a_phone_photo_stored_sideways_and_annotated_as_stored_is_read_as_stored(
    tmp_path, log_lines, monkeypatch
):
    """LabelImg draws on the pixels as stored; OpenCV turns a photo upright by its EXIF orientation. The
    boxes of such a photo fit only the stored pixels: training reads it as stored, the checker says so."""
    from PIL import Image

    from yolox_fast.data.check import check_images
    from yolox_fast.data.datasets.base import DetectionDataset
    from yolox_fast.data.datasets.problems import DatasetProblems

    monkeypatch.setattr(DetectionDataset, "_warned_orientation", False)  # logged once per process

    root = tmp_path / "phone"
    (root / "images").mkdir(parents=True)
    (root / "annotations").mkdir()
    for k in range(3):  # stored 120 x 80 (w x h), EXIF orientation 6: OpenCV returns it 80 x 120
        pixels = np.zeros((80, 120, 3), dtype=np.uint8)
        pixels[10:30, 20 + k : 60 + k] = 255
        photo = Image.fromarray(pixels)
        exif = photo.getexif()
        exif[0x0112] = 6
        photo.save(root / "images" / f"p{k}.jpg", exif=exif.tobytes(), quality=95)
        (root / "annotations" / f"p{k}.xml").write_text(
            f"<annotation><filename>p{k}.jpg</filename><size><width>120</width><height>80</height></size>"
            f"<object><name>spot</name><bndbox><xmin>{21 + k}</xmin><ymin>11</ymin><xmax>{60 + k}</xmax>"
            "<ymax>30</ymax></bndbox></object></annotation>"
        )
    dataset = build_train_dataset(exp_for(str(root), num_classes=1, input_size=(80, 120)))
    img = dataset.load_image(0)
    assert img.shape == (80, 120, 3)
    x1, y1, x2, y2 = (int(v) for v in dataset.records[0].boxes[0])
    assert img[y1:y2, x1:x2].mean() > 200 and img[40:, :].mean() < 30  # the box is on the spot
    assert sum("stored sideways" in m for m in log_lines) == 1
    problems = DatasetProblems(collect=True)
    check_images(dataset, problems)
    assert problems.count("image stored sideways, annotated as stored") == len(dataset)
