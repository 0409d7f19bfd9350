"""describe_folder: the dataset description of a folder laid out as a labelling tool or a benchmark left it.

`exp.dataset` (or `--dataset`) may be a folder instead of a description. Recognised, in this order:

- `data.yaml` / `data.yml`: Ultralytics YOLO (the yaml's own description);
- `train/_annotations.coco.json` and `valid/` (or `val/`, `test/`) with theirs: a Roboflow / CVAT COCO
  export;
- `annotations/instances_<split>.json` with the image folders `<split>/`: COCO in YOLOX's layout;
- `VOC<year>/ImageSets/Main/`: a VOCdevkit (every year's trainval, else train, to train; VOC2007 test,
  else val, to validate);
- `Annotations/`, `JPEGImages/` and `ImageSets/Main/train.txt` with `val.txt` (or `test.txt`): a VOC
  folder of any name;
- `train/` and `valid/` (or `val/`, `test/`), each holding images and their XML files: a Roboflow / CVAT
  Pascal VOC export;
- XML files in `Annotations/`, `annotations/`, `xml/`, `labels/` or beside the images: LabelImg / CVAT
  output, split by `val_ratio` 0.2 and `split_seed` 0.

The description found is logged as JSON, so it can be saved as a file and edited (another val_ratio,
split lists, a CSV split). Nothing but file names and the annotation files' categories is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loguru import logger

from yolox_fast.data.datasets.yolo import yolo_description

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
VAL_NAMES = ("valid", "val", "test")
XML_FOLDERS = ("Annotations", "annotations", "xml", "labels", "Labels")
IMAGE_FOLDERS = ("JPEGImages", "images", "Images", "imgs", "img")
DEFAULT_VAL_RATIO = 0.2


def _has(folder: Path, suffixes: tuple[str, ...]) -> bool:
    return folder.is_dir() and any(p.suffix.lower() in suffixes for p in folder.iterdir())


def _first_dir(root: Path, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if (root / n).is_dir()), None)


def _roboflow_coco(root: Path) -> dict[str, Any] | None:
    ann = "_annotations.coco.json"
    if not (root / "train" / ann).is_file():
        return None
    val = next((n for n in VAL_NAMES if (root / n / ann).is_file()), None)
    if val is None:
        return None
    return {
        "format": "coco",
        "train": {"images": "train", "ann": f"train/{ann}"},
        "val": {"images": val, "ann": f"{val}/{ann}"},
    }


def _yolox_coco(root: Path) -> dict[str, Any] | None:
    folder = root / "annotations"
    if not folder.is_dir():
        return None
    splits = {}
    for part, prefixes in (("train", ("train",)), ("val", ("val", "test"))):
        found = sorted(
            p
            for p in folder.glob("instances_*.json")
            if p.stem[len("instances_") :].startswith(prefixes)
            and (root / p.stem[len("instances_") :]).is_dir()
        )
        if not found:
            return None
        images = found[-1].stem[len("instances_") :]  # the latest year when several are there
        splits[part] = {"images": images, "ann": found[-1].name}
    return {"format": "coco", **splits}


def _vocdevkit(root: Path) -> dict[str, Any] | None:
    years = sorted(p.name[3:] for p in root.glob("VOC*") if (p / "ImageSets" / "Main").is_dir())
    if not years:
        return None

    def has(year: str, name: str) -> bool:
        return (root / f"VOC{year}" / "ImageSets" / "Main" / f"{name}.txt").is_file()

    train = [
        [y, "trainval"] if has(y, "trainval") else [y, "train"]
        for y in years
        if has(y, "trainval") or has(y, "train")
    ]
    val_year = "2007" if "2007" in years else years[-1]
    val_name = next((n for n in ("test", "val") if has(val_year, n)), None)
    if not train or val_name is None:
        return None
    if val_name == "val":  # trainval holds val: train on train then
        train = [[y, "train"] if y == val_year else [y, s] for y, s in train]
    return {"format": "voc", "train": {"sets": train}, "val": {"sets": [[val_year, val_name]]}}


def _voc_folder(root: Path) -> dict[str, Any] | None:
    main = root / "ImageSets" / "Main"
    if not ((root / "Annotations").is_dir() and (root / "JPEGImages").is_dir() and main.is_dir()):
        return None
    val = next((n for n in ("val", "test") if (main / f"{n}.txt").is_file()), None)
    if not (main / "train.txt").is_file() or val is None:
        return None
    return {
        "format": "voc",
        "train": {"list": "ImageSets/Main/train.txt"},
        "val": {"list": f"ImageSets/Main/{val}.txt"},
    }


def _roboflow_voc(root: Path) -> dict[str, Any] | None:
    if not _has(root / "train", (".xml",)):
        return None
    val = next((n for n in VAL_NAMES if _has(root / n, (".xml",))), None)
    if val is None:
        return None
    return {
        "format": "voc",
        "train": {"images": "train", "annotations": "train"},
        "val": {"images": val, "annotations": val},
    }


def _labelimg(root: Path) -> dict[str, Any] | None:
    xml = _first_dir(root, tuple(n for n in XML_FOLDERS if _has(root / n, (".xml",))))
    if xml is None and _has(root, (".xml",)):
        xml = "."
    if xml is None:
        return None
    if xml != "." and _has(root / xml, IMAGE_SUFFIXES):
        images = xml
    else:
        images = _first_dir(root, tuple(n for n in IMAGE_FOLDERS if _has(root / n, IMAGE_SUFFIXES)))
        images = images or ("." if _has(root, IMAGE_SUFFIXES) else None)
    if images is None:
        return None
    return {
        "format": "voc",
        "images": images,
        "annotations": xml,
        "val_ratio": DEFAULT_VAL_RATIO,
        "split_seed": 0,
    }


def describe_folder(folder: str | Path) -> dict[str, Any]:
    """The description (the layout of `configs/*.json`) of a dataset folder, by the table in the module
    docstring; class names are left to the data (`description.data_class_names`). FileNotFoundError saying
    what was looked for when the folder matches no layout."""
    root = Path(folder).expanduser().resolve()
    for yaml_name in ("data.yaml", "data.yml"):
        if (root / yaml_name).is_file():
            logger.info(f"dataset folder {root}: read through its {yaml_name} (Ultralytics YOLO)")
            return yolo_description(root / yaml_name)
    layouts = (
        ("a Roboflow/CVAT COCO export", _roboflow_coco),
        ("COCO in YOLOX's layout", _yolox_coco),
        ("a VOCdevkit", _vocdevkit),
        ("a VOC folder", _voc_folder),
        ("a Roboflow/CVAT Pascal VOC export", _roboflow_voc),
        ("LabelImg/CVAT XML files without split lists", _labelimg),
    )
    for what, detect in layouts:
        found = detect(root)
        if found is not None:
            cfg = {"name": root.name, "root": str(root), **found}
            logger.info(
                f"dataset folder {root}: read as {what}; the same as this description (save it as a .json to "
                f"change it):\n{json.dumps(cfg)}"
            )
            return cfg
    raise FileNotFoundError(
        f"dataset folder {root} matches no layout read without a description: looked for data.yaml; "
        "train/_annotations.coco.json with valid/ or val/; annotations/instances_*.json; "
        "VOC<year>/ImageSets; Annotations/ + JPEGImages/ + ImageSets/Main/{train,val}.txt; train/ and valid/ "
        f"holding XML files; XML files in {'/, '.join(XML_FOLDERS)}/ or beside the images. Write a "
        "description for it (docs/datasets.md)"
    )
