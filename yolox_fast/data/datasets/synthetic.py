"""Built-in synthetic detection data: coloured shapes on textured, unevenly lit backgrounds.

Deterministic: image i of a split is drawn from its own generator seeded by (seed, split, i), so the
same settings give the same files. Written in COCO (json + jpg) or VOC (XML + ImageSets) format,
into a temporary folder renamed into place at the end, so a killed generation leaves no half set
behind (the next use regenerates it).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from loguru import logger

SHAPE_NAMES = ("circle", "square", "triangle", "star", "cross", "ring")
# min_side 8 for sets whose description does not say (the tests' and benchmarks'); the quick-start set
# (configs/shapes.json) says 16: below that the six kinds are a few pixels apart and a 15-minute model
# spends its capacity on guesses
DEFAULTS = {"num_train": 1000, "num_val": 150, "size": 320, "seed": 0, "max_objects": 8, "min_side": 8}
MARKER = ".complete.json"  # written last inside the set; its absence means "regenerate"
MIN_VISIBLE = 0.4  # a new shape may not hide more than 60% of an earlier one


def _polygon(kind: str, cx: float, cy: float, side: float, angle: float) -> np.ndarray:
    """Vertices (V, 2) of a polygonal shape of extent ~`side` px centred at (cx, cy), rotated by angle rad."""
    half = side / 2
    if kind == "square":
        radii, angles = np.full(4, half * 0.8 * math.sqrt(2)), np.arange(4) * math.pi / 2 + math.pi / 4
    elif kind == "triangle":
        radii, angles = np.full(3, half), np.arange(3) * 2 * math.pi / 3 - math.pi / 2
    elif kind == "star":
        radii = np.where(np.arange(10) % 2 == 0, half, half * 0.42)
        angles = np.arange(10) * math.pi / 5 - math.pi / 2
    else:  # cross: a plus sign with arms a third of the side wide
        a, b = half, half / 3
        pts = np.array(
            [
                [-b, -a],
                [b, -a],
                [b, -b],
                [a, -b],
                [a, b],
                [b, b],
                [b, a],
                [-b, a],
                [-b, b],
                [-a, b],
                [-a, -b],
                [-b, -b],
            ],
            dtype=np.float64,
        )
        radii, angles = np.hypot(pts[:, 0], pts[:, 1]), np.arctan2(pts[:, 1], pts[:, 0])
    angles = angles + angle
    return np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], axis=1)


def _shape_mask(kind: str, size: int, cx: float, cy: float, side: float, angle: float) -> np.ndarray:
    mask = np.zeros((size, size), dtype=np.uint8)
    centre = (round(cx), round(cy))
    if kind == "circle":
        cv2.circle(mask, centre, max(round(side / 2), 2), 1, thickness=-1)
    elif kind == "ring":
        thick = max(round(side / 6), 2)
        cv2.circle(mask, centre, max(round(side / 2 - thick / 2), 2), 1, thickness=thick)
    else:
        pts = np.round(_polygon(kind, cx, cy, side, angle)).astype(np.int32)
        cv2.fillPoly(mask, [pts], 1)
    return mask.astype(bool)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    base = rng.uniform(30, 225, 3)
    grid = rng.integers(3, 9)
    blobs = cv2.resize(
        rng.normal(0, 35, (grid, grid, 3)).astype(np.float32), (size, size), interpolation=cv2.INTER_CUBIC
    )
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    theta, freq = rng.uniform(0, math.pi), rng.uniform(0.05, 0.4)
    stripes = np.sin((xx * math.cos(theta) + yy * math.sin(theta)) * freq) * rng.uniform(0, 18)
    return base + blobs + stripes[..., None]


def _lighting(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    size = img.shape[0]
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size - 0.5
    theta = rng.uniform(0, 2 * math.pi)
    gradient = (xx * math.cos(theta) + yy * math.sin(theta)) * rng.uniform(0, 0.6)
    vignette = -(xx**2 + yy**2) * rng.uniform(0, 0.8)
    img = img * (rng.uniform(0.7, 1.2) + gradient + vignette)[..., None]
    img = img + rng.normal(0, rng.uniform(2, 10), img.shape)
    if rng.random() < 0.3:
        img = cv2.GaussianBlur(img.astype(np.float32), (3, 3), 0)
    return np.clip(img, 0, 255).astype(np.uint8)


def render_image(
    rng: np.random.Generator, size: int, max_objects: int = 8, min_side: float = 8
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One synthetic image: (BGR uint8 (size, size, 3), boxes (K, 4) x1y1x2y2 px, classes (K,) int64).

    Boxes are the tight hull of each whole shape (occluded parts included, as annotators draw them);
    shapes are placed so none loses more than 60% of its pixels under later ones.
    """
    canvas = _background(rng, size)
    owner = np.full((size, size), -1, dtype=np.int16)  # which object each pixel shows
    areas: list[int] = []
    boxes, classes = [], []
    max_side = max(size / 2, min_side + 1)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        cls = int(rng.integers(len(SHAPE_NAMES)))
        kind = SHAPE_NAMES[cls]
        for _attempt in range(10):
            side = math.exp(rng.uniform(math.log(min_side), math.log(max_side)))
            cx, cy = rng.uniform(side / 2, size - side / 2, 2)
            angle = rng.uniform(-0.25, 0.25) if kind == "square" else rng.uniform(0, 2 * math.pi)
            mask = _shape_mask(kind, size, cx, cy, side, angle)
            if mask.sum() < 16:
                continue
            hidden = np.bincount(owner[mask & (owner >= 0)], minlength=len(areas))
            if all(
                vis >= MIN_VISIBLE * a
                for vis, a in zip(np.bincount(owner[owner >= 0], minlength=len(areas)) - hidden, areas)
            ):
                break
        else:
            continue
        local = canvas[mask].mean(0)
        colour = rng.uniform(0, 255, 3)
        for _attempt in range(10):  # keep shapes visibly different from what they sit on
            if np.abs(colour - local).sum() > 120:
                break
            colour = rng.uniform(0, 255, 3)
        canvas[mask] = colour + rng.normal(0, 4, (int(mask.sum()), 3))
        owner[mask] = len(areas)
        areas.append(int(mask.sum()))
        ys, xs = np.nonzero(mask)
        boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
        classes.append(cls)
    img = _lighting(rng, canvas)
    return img, np.array(boxes, dtype=np.float32).reshape(-1, 4), np.array(classes, dtype=np.int64)


def _write_jpg(path: Path, img: np.ndarray) -> None:
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 92])
    assert ok, "JPEG encoding of a generated image failed"
    path.write_bytes(buf.tobytes())


def _voc_xml(file_name: str, size: int, boxes: np.ndarray, classes: np.ndarray) -> str:
    objects = "".join(
        f"<object><name>{SHAPE_NAMES[c]}</name><pose>Unspecified</pose><truncated>0</truncated>"
        f"<difficult>0</difficult><bndbox><xmin>{int(b[0]) + 1}</xmin><ymin>{int(b[1]) + 1}</ymin>"
        f"<xmax>{int(b[2])}</xmax><ymax>{int(b[3])}</ymax></bndbox></object>"
        for b, c in zip(boxes, classes)
    )
    return (
        f"<annotation><folder>shapes</folder><filename>{file_name}</filename><size><width>{size}</width>"
        f"<height>{size}</height><depth>3</depth></size>{objects}</annotation>\n"
    )


def default_description(fmt: str, root: str, name: str = "shapes") -> dict[str, Any]:
    """The dataset description (configs/*.json layout) of a generated shapes set at `root`."""
    if fmt == "coco":
        splits = {
            "train": {"images": "train2017", "ann": "instances_train2017.json"},
            "val": {"images": "val2017", "ann": "instances_val2017.json"},
        }
    elif fmt == "voc":
        splits = {"train": {"sets": [["2007", "train"]]}, "val": {"sets": [["2007", "val"]]}}
    else:
        raise ValueError(f"format must be 'coco' or 'voc', got {fmt!r}")
    return {"name": name, "format": fmt, "root": root, **splits, "class_names": list(SHAPE_NAMES)}


def _write_split(out: Path, cfg: dict[str, Any], split: str, params: dict[str, Any]) -> None:
    n = params[f"num_{split}"]
    size = params["size"]
    split_code = 0 if split == "train" else 1
    if cfg["format"] == "coco":
        img_dir = out / cfg[split]["images"]
        img_dir.mkdir(parents=True, exist_ok=True)
        images, anns = [], []
    else:
        year, set_name = cfg[split]["sets"][0]
        voc = out / f"VOC{year}"
        for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
            (voc / sub).mkdir(parents=True, exist_ok=True)
        stems = []
    for i in range(n):
        rng = np.random.default_rng([params["seed"], split_code, i])
        img, boxes, classes = render_image(rng, size, params["max_objects"], params["min_side"])
        if cfg["format"] == "coco":
            img_id = i + 1
            file_name = f"{img_id:06d}.jpg"
            _write_jpg(img_dir / file_name, img)
            images.append({"id": img_id, "file_name": file_name, "width": size, "height": size})
            for b, c in zip(boxes.tolist(), classes.tolist()):
                w, h = b[2] - b[0], b[3] - b[1]
                anns.append(
                    {
                        "id": len(anns) + 1,
                        "image_id": img_id,
                        "category_id": c + 1,
                        "bbox": [b[0], b[1], w, h],
                        "area": w * h,
                        "iscrowd": 0,
                    }
                )
        else:
            stem = f"{split}_{i:06d}"
            _write_jpg(voc / "JPEGImages" / f"{stem}.jpg", img)
            (voc / "Annotations" / f"{stem}.xml").write_text(_voc_xml(f"{stem}.jpg", size, boxes, classes))
            stems.append(stem)
    if cfg["format"] == "coco":
        (out / "annotations").mkdir(exist_ok=True)
        cats = [{"id": i + 1, "name": n_, "supercategory": "shape"} for i, n_ in enumerate(SHAPE_NAMES)]
        (out / "annotations" / cfg[split]["ann"]).write_text(
            json.dumps({"images": images, "annotations": anns, "categories": cats})
        )
    else:
        (voc / "ImageSets" / "Main" / f"{set_name}.txt").write_text("".join(s + "\n" for s in stems))


def generate(cfg: dict[str, Any], params: dict[str, Any] | None = None) -> Path:
    """Render the shapes set `cfg` describes (format, root, split names) with `params`
    (num_train, num_val, size, seed, max_objects, min_side; defaults from DEFAULTS, then cfg["synthetic"]).

    Writes into `<root>.partial-<pid>` and renames it to `root` when complete; a previous set at
    `root` is replaced. Also writes `<root>/dataset.json` (a description usable as exp.dataset).
    Returns the root.
    """
    params = {**DEFAULTS, **cfg.get("synthetic", {}), **(params or {})}
    root = Path(cfg["root"])
    tmp = root.parent / f"{root.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    start = time.time()
    for split in ("train", "val"):
        _write_split(tmp, cfg, split, params)
    description = {k: v for k, v in cfg.items() if k not in ("synthetic", "config_path")}
    description["root"] = str(root.resolve())
    (tmp / "dataset.json").write_text(json.dumps(description, indent=1))
    (tmp / MARKER).write_text(json.dumps({"format": cfg["format"], **params}))
    if root.exists():
        shutil.rmtree(root)
    os.rename(tmp, root)
    logger.info(
        f"generated the synthetic {cfg['format'].upper()} set at {root}: {params['num_train']} train + "
        f"{params['num_val']} val images of {params['size']} px in {time.time() - start:.1f}s"
    )
    return root


def ensure_generated(cfg: dict[str, Any]) -> None:
    """Generate the set a description with a "synthetic" block describes, unless a complete one with
    the same settings is already at its root. Safe with several processes: one generates, the others
    wait on a file lock and then find it complete."""
    params = {**DEFAULTS, **cfg["synthetic"]}
    root = Path(cfg["root"])
    wanted = {"format": cfg["format"], **params}

    def complete() -> bool:
        marker = root / MARKER
        return marker.is_file() and json.loads(marker.read_text()) == wanted

    if complete():
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete():
            return
        if root.exists():
            logger.warning(f"{root} is incomplete or was generated with other settings; regenerating it")
        generate(cfg, params)
