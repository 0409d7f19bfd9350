"""Dataset descriptions: where a dataset lives and in which format.

A description is a JSON file (the built-in ones, `coco`, `voc` and `shapes`, ship in
`yolox_fast/data/configs/`) or an Ultralytics `data.yaml`. Roots may start with `$YOLOX_DATADIR`, the
folder that holds the datasets: the environment variable of that name, else `./datasets`. A relative
root is relative to the working directory. Nothing here reads images or generates data.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
FORMATS = ("coco", "voc", "yolo")
YAML_SUFFIXES = (".yaml", ".yml")


def data_dir() -> Path:
    """The folder that holds the datasets: $YOLOX_DATADIR, else `datasets` in the working directory."""
    return Path(os.environ.get("YOLOX_DATADIR") or "datasets").expanduser().absolute()


def resolve_root(root: str) -> str:
    """A description's root as an absolute path: `$YOLOX_DATADIR` expanded, relative to the working dir."""
    expanded = string.Template(str(root)).safe_substitute(YOLOX_DATADIR=str(data_dir()))
    return str(Path(expanded).expanduser().absolute())


def builtin_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_dataset_config(name_or_path: str | Path) -> dict[str, Any]:
    """Load a dataset description by name (a built-in: coco, voc, shapes) or by path (.json or data.yaml).

    Returns the description dict with `root` absolute and `class_names` filled in: for COCO
    descriptions without the list, the names are read from the categories of the first annotation
    file that exists. Raises FileNotFoundError naming the built-in descriptions for an unknown name,
    ValueError for a malformed description.
    """
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        candidate = CONFIG_DIR / f"{name_or_path}.json"
        if not candidate.is_file():
            raise FileNotFoundError(
                f"dataset description {str(name_or_path)!r} not found: neither a file nor a built-in "
                f"description ({', '.join(builtin_names())})"
            )
        path = candidate
    if path.suffix.lower() in YAML_SUFFIXES:
        from yolox_fast.data.datasets.yolo import yolo_description

        cfg = yolo_description(path)
    else:
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"dataset description {path} is not valid JSON: {err}") from err
    cfg["config_path"] = str(path.resolve())
    validate_description(cfg, path)
    cfg["root"] = resolve_root(cfg["root"])
    if not cfg.get("class_names"):
        cfg["class_names"] = coco_category_names(cfg, path)
    return cfg


def validate_description(cfg: dict[str, Any], path: Path | str) -> None:
    """ValueError naming `path` and the problem when a description lacks a key or has an unknown format."""
    for key in ("name", "format", "root", "train", "val"):
        if key not in cfg:
            raise ValueError(f"dataset description {path} lacks the key {key!r}")
    if cfg["format"] not in FORMATS:
        raise ValueError(
            f"dataset description {path}: format must be one of {FORMATS}, got {cfg['format']!r}"
        )
    needed = {"coco": ("images", "ann"), "voc": ("sets",), "yolo": ("images",)}[cfg["format"]]
    for split in ("train", "val"):
        missing = [k for k in needed if k not in cfg[split]]
        if missing:
            raise ValueError(f"dataset description {path}: split {split!r} lacks {missing}")
    if cfg["format"] in ("voc", "yolo") and not cfg.get("class_names"):
        raise ValueError(f"dataset description {path}: {cfg['format'].upper()} descriptions need class names")


def coco_category_names(cfg: dict[str, Any], path: Path | str | None = None) -> list[str]:
    """Class names of a COCO-format description from its annotation files' categories, sorted by id."""
    # val first: it is the small file (COCO train annotations are ~450 MB)
    for split in ("val", "train"):
        ann = annotation_path(cfg["root"], cfg[split]["ann"])
        if os.path.isfile(ann):
            try:
                cats = json.loads(Path(ann).read_text()).get("categories", [])
            except json.JSONDecodeError as err:
                raise ValueError(f"COCO annotation file {ann} is not valid JSON ({err}): truncated?") from err
            return [c["name"] for c in sorted(cats, key=lambda c: c["id"])]
    raise FileNotFoundError(
        f"dataset description {path or cfg.get('config_path')} has no class_names and no annotation file to "
        f"read them from (looked for {cfg['val']['ann']} and {cfg['train']['ann']} under "
        f"{cfg['root']}/annotations)"
    )


def annotation_path(root: str, ann: str) -> str:
    """A COCO annotation file: `ann` itself if absolute, else `<root>/annotations/<ann>` (YOLOX's layout)."""
    return ann if os.path.isabs(ann) else os.path.join(root, "annotations", ann)
