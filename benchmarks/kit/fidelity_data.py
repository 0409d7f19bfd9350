"""The data the comparisons with official YOLOX run on: a generated shapes set laid out like the issue's.

`make_fidelity_set` renders the built-in synthetic shapes (`yolox_fast.data.datasets.synthetic`), then
rewrites it so that it has what made the issue's set different from the quick start's: 4 classes with
non-contiguous COCO category ids (3, 7, 11, 20 by default) and non-square images. The six shapes merge
into four classes (round: circle and ring; polygon: square and triangle; star; cross); a share of the
images is resized anisotropically to an aspect ratio in [0.55, 0.85] (portrait or landscape, at
random), boxes scaled with them, so no annotation is lost or cut. Both YOLOX implementations read the
same files: `<root>/{train2017,val2017}/`, `<root>/annotations/instances_{train,val}2017.json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from yolox_fast.data.datasets.synthetic import default_description, generate

CLASS_NAMES = ("round", "polygon", "star", "cross")
# generated shape name -> class index (CLASS_NAMES order)
SHAPE_TO_CLASS = {"circle": 0, "ring": 0, "square": 1, "triangle": 1, "star": 2, "cross": 3}
MARKER = ".fidelity.json"


def make_fidelity_set(
    root: str | Path,
    num_train: int = 208,
    num_val: int = 60,
    size: int = 256,
    seed: int = 0,
    non_square: float = 0.5,
    category_ids: Sequence[int] = (3, 7, 11, 20),
    max_objects: int = 8,
) -> Path:
    """Write the set at `root` (reused when one with the same settings is there); returns the path of
    its dataset description (`<root>/dataset.json`, usable as `exp.dataset`).

    `size`: side of the generated square images (a non-square image keeps it as its long side);
    `non_square`: the share of images made non-square; `category_ids`: the COCO ids of the 4 classes.
    """
    if len(category_ids) != len(CLASS_NAMES):
        raise ValueError(f"need {len(CLASS_NAMES)} category ids, got {list(category_ids)}")
    root = Path(root)
    params = {
        "num_train": num_train,
        "num_val": num_val,
        "size": size,
        "seed": seed,
        "non_square": non_square,
        "category_ids": [int(c) for c in category_ids],
        "max_objects": max_objects,
    }
    marker = root / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == params:
        return root / "dataset.json"
    generate(
        default_description("coco", str(root), name=root.name),
        {"num_train": num_train, "num_val": num_val, "size": size, "seed": seed, "max_objects": max_objects},
    )
    for split_code, split in enumerate(("train", "val")):
        _rewrite_split(root, split, np.random.default_rng([seed, 77, split_code]), non_square, category_ids)
    description = json.loads((root / "dataset.json").read_text())
    description["class_names"] = list(CLASS_NAMES)
    (root / "dataset.json").write_text(json.dumps(description, indent=1))
    marker.write_text(json.dumps(params))
    return root / "dataset.json"


def _rewrite_split(
    root: Path, split: str, rng: np.random.Generator, non_square: float, category_ids: Sequence[int]
) -> None:
    ann_path = root / "annotations" / f"instances_{split}2017.json"
    data = json.loads(ann_path.read_text())
    shape_of_cat = {c["id"]: c["name"] for c in data["categories"]}
    scale_of_image = {}
    for info in data["images"]:
        sx = sy = 1.0
        if rng.random() < non_square:
            aspect = rng.uniform(0.55, 0.85)
            if rng.random() < 0.5:
                sx = aspect
            else:
                sy = aspect
            path = root / f"{split}2017" / info["file_name"]
            img = cv2.imread(str(path))
            new_w, new_h = round(info["width"] * sx), round(info["height"] * sy)
            img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_AREA)
            cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, 92])
            sx, sy = new_w / info["width"], new_h / info["height"]
            info["width"], info["height"] = new_w, new_h
        scale_of_image[info["id"]] = (sx, sy)
    for ann in data["annotations"]:
        sx, sy = scale_of_image[ann["image_id"]]
        x, y, w, h = ann["bbox"]
        ann["bbox"] = [x * sx, y * sy, w * sx, h * sy]
        ann["area"] = w * sx * h * sy
        ann["category_id"] = int(category_ids[SHAPE_TO_CLASS[shape_of_cat[ann["category_id"]]]])
    # categories deliberately listed out of id order: both readers must sort them
    data["categories"] = [
        {"id": int(cid), "name": name, "supercategory": "shape"}
        for cid, name in reversed(list(zip(category_ids, CLASS_NAMES)))
    ]
    ann_path.write_text(json.dumps(data))
