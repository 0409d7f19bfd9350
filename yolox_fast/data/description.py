"""read_description: a dataset description, which says where a dataset lives and in which format.

A description is a JSON file (the built-in ones, `coco`, `voc` and `shapes`, are the top-level `configs/`,
which the package carries as `yolox_fast/configs/`), an Ultralytics `data.yaml`, or a dataset folder whose
layout is recognised (`layouts.py`). Roots may start with `$YOLOX_DATADIR`, the folder that holds the
datasets: the environment variable of that name, else `./datasets` (`paths.py`). A relative root is
relative to the working directory. Nothing here reads images or generates data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from yolox_fast.data.datasets.coco import coco_category_names
from yolox_fast.data.datasets.voc import xml_class_names
from yolox_fast.data.datasets.yolo import yolo_description
from yolox_fast.data.layouts import describe_folder
from yolox_fast.data.paths import CONFIG_DIR, builtin_names, resolve_root

FORMATS = ("coco", "voc", "yolo")
YAML_SUFFIXES = (".yaml", ".yml")


def read_description(name_or_path: str | Path, class_names: bool = True) -> dict[str, Any]:
    """Read a dataset description by name (a built-in: coco, voc, shapes), by path (.json or data.yaml),
    or from a dataset folder, whose layout is recognised (`layouts.describe_folder`).

    Returns the description dict with `root` absolute, a VOC description's splits in their full form
    (`expand_voc_splits`) and, with `class_names`, the class names filled in when the description has
    none: read from the categories of the first COCO annotation file that exists, or from the object
    names of the VOC XML files. Raises FileNotFoundError naming the built-in descriptions for an unknown
    name, ValueError for a malformed description.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        cfg = describe_folder(path)
    else:
        if not path.is_file():
            path = CONFIG_DIR / f"{name_or_path}.json"
            if not path.is_file():
                raise FileNotFoundError(
                    f"dataset description {str(name_or_path)!r} not found: neither a file, a dataset folder "
                    f"nor a built-in description ({', '.join(builtin_names())})"
                )
        cfg = _read_file(path)
    cfg["config_path"] = str(path.resolve())
    if cfg.get("format") == "voc":
        expand_voc_splits(cfg, path)
    validate_description(cfg, path)
    cfg["root"] = resolve_root(cfg["root"])
    if class_names and not cfg.get("class_names"):
        cfg["class_names"] = data_class_names(cfg, path)
    return cfg


def _read_file(path: Path) -> dict[str, Any]:
    if path.suffix.lower() in YAML_SUFFIXES:
        return yolo_description(path)
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"dataset description {path} is not valid JSON: {err}") from err
    if not isinstance(cfg, dict):
        raise ValueError(f"dataset description {path} is not a JSON object")
    return cfg


def expand_voc_splits(cfg: dict[str, Any], path: Path | str) -> None:
    """A VOC description's splits in full (in place): a top-level `val_ratio` (with `split_seed`, default
    0) becomes the train and val parts of every XML file, and the top-level `images` / `annotations`
    folders go into each split that is not VOCdevkit `sets` and names none of its own."""
    if "val_ratio" in cfg:
        if "train" in cfg or "val" in cfg:
            raise ValueError(
                f"dataset description {path}: give either val_ratio (a split made from every XML file) or "
                "train and val, not both"
            )
        ratio = cfg["val_ratio"]
        if not isinstance(ratio, (int, float)) or not 0 < ratio < 1:
            raise ValueError(
                f"dataset description {path}: val_ratio must be a number in (0, 1), got {ratio!r}"
            )
        seed = cfg.setdefault("split_seed", 0)
        for part in ("train", "val"):
            cfg[part] = {"val_ratio": ratio, "split_seed": seed, "part": part}
    for part in ("train", "val"):
        split = cfg.get(part)
        if isinstance(split, dict) and "sets" not in split:
            for key in ("images", "annotations"):
                if key in cfg and key not in split:
                    split[key] = cfg[key]


def data_class_names(cfg: dict[str, Any], path: Path | str | None = None) -> list[str]:
    """The class names the data itself gives: COCO categories, or the object names of the VOC XML files."""
    if cfg["format"] == "voc":
        return xml_class_names(cfg["root"], [cfg["train"], cfg["val"]])
    if cfg["format"] == "coco":
        return coco_category_names(cfg, path)
    raise ValueError(f"dataset description {path or cfg.get('config_path')} gives no class names")


def validate_description(cfg: dict[str, Any], path: Path | str) -> None:
    """ValueError naming `path` and the problem when a description lacks a key or has an unknown format."""
    for key in ("name", "format", "root", "train", "val"):
        if key not in cfg:
            raise ValueError(f"dataset description {path} lacks the key {key!r}")
    if cfg["format"] not in FORMATS:
        raise ValueError(
            f"dataset description {path}: format must be one of {FORMATS}, got {cfg['format']!r}"
        )
    needed = {"coco": ("images", "ann"), "voc": (), "yolo": ("images",)}[cfg["format"]]
    for split in ("train", "val"):
        if not isinstance(cfg[split], dict):
            raise ValueError(
                f"dataset description {path}: split {split!r} must be an object, got {cfg[split]!r}"
            )
        missing = [k for k in needed if k not in cfg[split]]
        if missing:
            raise ValueError(f"dataset description {path}: split {split!r} lacks {missing}")
        chosen = [k for k in ("sets", "list", "csv", "val_ratio") if k in cfg[split]]
        if cfg["format"] == "voc" and len(chosen) > 1:
            raise ValueError(
                f"dataset description {path}: split {split!r} names its images in {len(chosen)} ways "
                f"({', '.join(chosen)}); give one"
            )
    if cfg["format"] == "yolo" and not cfg.get("class_names"):
        raise ValueError(f"dataset description {path}: YOLO descriptions need class names")
    metric = cfg.get("metric")
    if metric is not None and metric not in ("coco", "voc"):
        raise ValueError(f"dataset description {path}: metric must be 'coco' or 'voc', got {metric!r}")
    if metric == "voc" and cfg["format"] != "voc":
        raise ValueError(f"dataset description {path}: the VOC metric scores VOC-format sets only")
