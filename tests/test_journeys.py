"""A user's journey with their own data, as they type it: train one short epoch, evaluate, run the demo
and export the trained checkpoint, for COCO data through a description file (each tool a fresh process),
COCO data the YOLOX way (`data_dir` on the built-in description) and VOC data (the same command lines run
as the interpreter runs them, in this process: the tools' processes are the first journey's)."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import run_tool_in_process, run_tool_process

REPO = Path(__file__).resolve().parents[1]
SHAPES_EXP = str(REPO / "exps" / "example" / "shapes_nano.py")
CUSTOM_COCO_EXP = str(REPO / "exps" / "example" / "custom_coco.py")
# the user's own categories: names no built-in list has, ids that are not 1..K
USER_CATEGORIES = {3: "disc", 7: "box", 11: "wedge", 20: "sparkle", 31: "plus", 40: "hoop"}
TINY = [
    "input_size",
    "(64,64)",
    "test_size",
    "(64,64)",
    "random_size",
    "(2,2)",
    "data_num_workers",
    "0",
    "max_epoch",
    "1",
    "no_aug_epochs",
    "0",
    "warmup_epochs",
    "0",
    "eval_interval",
    "1",
    "seed",
    "0",
]


def users_coco_set(src: str, dst: Path) -> Path:
    """A copy of a generated COCO set carrying the user's categories (USER_CATEGORIES)."""
    shutil.copytree(src, dst)
    new_id = dict(zip(range(1, 7), USER_CATEGORIES))
    for split in ("train", "val"):
        path = dst / "annotations" / f"instances_{split}2017.json"
        data = json.loads(path.read_text())
        data["categories"] = [{"id": i, "name": n, "supercategory": "x"} for i, n in USER_CATEGORIES.items()]
        for ann in data["annotations"]:
            ann["category_id"] = new_id[ann["category_id"]]
        path.write_text(json.dumps(data))
    return dst


def journey(
    exp_args: list, output: Path, exp_name: str, class_names, cwd: Path, images: Path, run=run_tool_in_process
) -> None:
    """train -> eval -> demo -> export on the exp `exp_args` (flags and KEY VALUE overrides), each tool
    through `run` (run_tool_process: a fresh process each)."""
    train_out = run("train", *exp_args[:2], "-b", "2", "-l", "none", *exp_args[2:], cwd=cwd)
    run_dir = output / exp_name
    ckpt = run_dir / "best_ckpt.pth"
    assert ckpt.is_file() and (run_dir / "latest_ckpt.pth").is_file(), train_out[-2000:]
    assert "classes" in train_out and class_names[0] in train_out  # the run summary names the data's classes

    eval_out = run("eval", *exp_args, "-b", "4", cwd=cwd)  # -c defaults to best_ckpt.pth
    for name in class_names:  # the per-class table, with the data's own names
        assert f"| {name} " in eval_out, f"class {name!r} missing from the eval output:\n{eval_out[-3000:]}"

    demo_out = run("demo", "image", *exp_args, "--path", str(images), "--save-json", "-b", "4", cwd=cwd)
    saved = sorted((run_dir / "vis_res").glob("*/detections.json"))
    assert saved, demo_out[-2000:]
    detections = json.loads(saved[-1].read_text())
    assert len(detections) == len(list(images.glob("*.jpg")))
    assert all(d["class_name"] in class_names for dets in detections.values() for d in dets)

    onnx = output / "model.onnx"
    export_out = run(
        "export_onnx", *exp_args[:2], "-c", str(ckpt), "--output-name", str(onnx), *exp_args[2:], cwd=cwd
    )
    assert onnx.is_file() and "max abs diff" in export_out


@pytest.mark.slow
def test_coco_data_through_a_description_file(tiny_shapes_coco, tmp_path):
    root = users_coco_set(tiny_shapes_coco["root"], tmp_path / "mine")
    desc = tmp_path / "mine.json"
    desc.write_text(
        json.dumps(
            {
                "name": "mine",
                "format": "coco",
                "root": str(root),
                "train": {"images": "train2017", "ann": "instances_train2017.json"},
                "val": {"images": "val2017", "ann": "instances_val2017.json"},
            }
        )
    )
    out = tmp_path / "out"
    args = ["-f", SHAPES_EXP, "dataset", str(desc), "output_dir", str(out), *TINY]
    names = list(USER_CATEGORIES.values())
    journey(args, out, "shapes_nano", names, tmp_path, root / "val2017", run_tool_process)


@pytest.mark.slow
def test_coco_data_the_yolox_way_with_data_dir_on_the_custom_coco_exp(tiny_shapes_coco, tmp_path):
    # exps/example/custom_coco.py as written, told where the data is and how many classes it has
    root = users_coco_set(tiny_shapes_coco["root"], tmp_path / "datasets" / "my_dataset")
    out = tmp_path / "out"
    args = ["-f", CUSTOM_COCO_EXP, "data_dir", str(root), "num_classes", "6", "output_dir", str(out), *TINY]
    journey(args, out, "custom_coco", list(USER_CATEGORIES.values()), tmp_path, root / "val2017")


@pytest.mark.slow
def test_voc_data(tiny_shapes_voc, tmp_path):
    out = tmp_path / "out"
    args = ["-f", SHAPES_EXP, "dataset", tiny_shapes_voc["config"], "output_dir", str(out), *TINY]
    images = Path(tiny_shapes_voc["root"]) / "VOC2007" / "JPEGImages"
    names = json.loads(Path(tiny_shapes_voc["config"]).read_text())["class_names"]
    journey(args, out, "shapes_nano", names, tmp_path, images)
