"""Dataset descriptions: `configs/NAME.json` files that say where a dataset lives and in which format."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
FORMATS = ("coco", "voc")


def load_dataset_config(name_or_path: str | Path) -> dict[str, Any]:
    """Load a dataset description by name (`configs/<name>.json`) or by path to a JSON file.

    Returns the description dict with `root` made absolute (a relative root is relative to the
    repository root) and `class_names` filled in: for COCO descriptions without the list, the names
    are read from the categories of the first annotation file that exists. Raises FileNotFoundError
    naming the known configs for an unknown name, ValueError for a malformed description.
    """
    path = Path(name_or_path)
    if not path.is_file():
        candidate = CONFIG_DIR / f"{name_or_path}.json"
        if not candidate.is_file():
            known = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
            raise FileNotFoundError(
                f"dataset description {str(name_or_path)!r} not found: neither a file nor one of "
                f"configs/{{{','.join(known)}}}.json"
            )
        path = candidate
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"dataset description {path} is not valid JSON: {err}") from err
    cfg["config_path"] = str(path.resolve())
    _validate(cfg, path)
    root = Path(cfg["root"]).expanduser()
    cfg["root"] = str(root if root.is_absolute() else REPO_ROOT / root)
    if not cfg.get("class_names"):
        cfg["class_names"] = _coco_category_names(cfg, path)
    return cfg


def _validate(cfg: dict[str, Any], path: Path) -> None:
    for key in ("name", "format", "root", "train", "val"):
        if key not in cfg:
            raise ValueError(f"dataset description {path} lacks the key {key!r}")
    if cfg["format"] not in FORMATS:
        raise ValueError(f"dataset description {path}: format must be one of {FORMATS}, got {cfg['format']!r}")
    for split in ("train", "val"):
        needed = ("images", "ann") if cfg["format"] == "coco" else ("sets",)
        missing = [k for k in needed if k not in cfg[split]]
        if missing:
            raise ValueError(f"dataset description {path}: split {split!r} lacks {missing}")
    if cfg["format"] == "voc" and not cfg.get("class_names"):
        raise ValueError(f"dataset description {path}: VOC descriptions need a class_names list")


def _coco_category_names(cfg: dict[str, Any], path: Path) -> list:
    # val first: it is the small file (COCO train annotations are ~450 MB)
    for split in ("val", "train"):
        ann = Path(cfg["root"]) / "annotations" / cfg[split]["ann"]
        if ann.is_file():
            cats = json.loads(ann.read_text()).get("categories", [])
            return [c["name"] for c in sorted(cats, key=lambda c: c["id"])]
    raise FileNotFoundError(
        f"dataset description {path} has no class_names and no annotation file to read them from "
        f"(looked for {cfg['val']['ann']} and {cfg['train']['ann']} under {cfg['root']}/annotations)"
    )
