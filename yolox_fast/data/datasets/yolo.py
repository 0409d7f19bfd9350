"""Ultralytics YOLO-format datasets: a data.yaml, folders (or lists) of images, one label .txt per image.

    datasets/my_yolo/data.yaml          train: images/train   val: images/val   names: [cat, dog]
    datasets/my_yolo/images/train/a.jpg
    datasets/my_yolo/labels/train/a.txt one "class cx cy w h" line per box, normalised to the image

data.yaml keys: `path` (the dataset root; absent: the yaml's folder; relative: tried against the yaml's
folder, then the working directory, then $YOLOX_DATADIR), `train` and `val` (each a folder of images,
searched recursively, a .txt file listing image paths, or a list of those; relative to the root; a
`../x` that does not exist is also tried as `x`, as Roboflow exports need), `names` (a list, or an
{id: name} mapping with ids 0..K-1), optional `nc` (must equal the number of names) and optional
`kpt_shape` (a pose set: the keypoints after the box are ignored).

A label file is found by the Ultralytics rule: the last `/images/` of the image path becomes
`/labels/` and the extension `.txt`. An image without one, or with an empty one, is a background
image. Label lines with more than 5 values are polygons (Ultralytics segment labels:
`class x1 y1 x2 y2 ... xn yn`, n >= 3) and are converted to their bounding box. A line with another
column count, a non-numeric or non-finite value, a class id outside 0..K-1, or a coordinate outside
[0, 1] by more than 1e-3 (within that it is clipped) is an error naming the file and line; with
`skip_corrupt` such lines are skipped and counted in one warning instead.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from loguru import logger
from pycocotools.coco import COCO

from yolox_fast.data.datasets.base import (
    BoxClipCounter,
    DetectionDataset,
    ImageRecord,
    records_to_coco,
)
from yolox_fast.data.datasets.index import DatasetIndex, IndexBuilder
from yolox_fast.data.datasets.problems import DatasetProblems
from yolox_fast.data.image_io import HEADER_THREADS, CorruptImageError, image_size, read_image
from yolox_fast.data.paths import datasets_root

IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")
COORD_TOLERANCE = 1e-3  # normalised coordinates this far outside [0, 1] are rounding, and clipped


# ------------------------------------------------------------------------------------------ data.yaml
def yolo_description(yaml_path: str | Path) -> dict[str, Any]:
    """The dataset description of an Ultralytics data.yaml (the layout of `configs/*.json`).

    Returns {"name" (the root folder's name), "format": "yolo", "root" (absolute), "train": {"images":
    [entries]}, "val": {...}, "class_names": [...], "keypoints": bool}. ValueError naming the yaml for
    a missing key, bad names or an nc that does not match; nothing is read but the yaml.
    """
    path = Path(yaml_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with train, val and names, got {type(data).__name__}")
    for key in ("train", "val", "names"):
        if not data.get(key):
            raise ValueError(f"{path} lacks the key {key!r} (a YOLO data.yaml needs train, val and names)")
    names = _class_names(data, path)
    root = _resolve_root(data.get("path"), path.parent.resolve())
    return {
        "name": root.name or path.stem,
        "format": "yolo",
        "root": str(root),
        "train": {"images": _entries(data["train"], path, "train")},
        "val": {"images": _entries(data["val"], path, "val")},
        "class_names": names,
        "keypoints": "kpt_shape" in data,
    }


def _class_names(data: dict[str, Any], path: Path) -> list[str]:
    names = data["names"]
    if isinstance(names, dict):
        try:
            by_id = {int(k): str(v) for k, v in names.items()}
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: names must map integer class ids to names ({err})") from err
        if sorted(by_id) != list(range(len(by_id))):
            ids = sorted(by_id)
            raise ValueError(f"{path}: the class ids in names must be 0..{len(ids) - 1}, got {ids}")
        names = [by_id[i] for i in range(len(by_id))]
    elif isinstance(names, list):
        names = [str(n) for n in names]
    else:
        raise ValueError(f"{path}: names must be a list or an {{id: name}} mapping, got {names!r}")
    if "nc" in data and data["nc"] != len(names):
        raise ValueError(f"{path}: nc is {data['nc']} but names lists {len(names)} classes")
    return names


def _entries(value: Any, path: Path, split: str) -> list[str]:
    entries = value if isinstance(value, list) else [value]
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise ValueError(f"{path}: {split} must be a path or a list of paths, got {value!r}")
    return entries


def _resolve_root(value: str | None, yaml_dir: Path) -> Path:
    """`path` of a data.yaml as an absolute folder (see the module docstring for the search order)."""
    if not value:
        return yaml_dir
    root = Path(str(value)).expanduser()
    if root.is_absolute():
        return root
    candidates = [yaml_dir / root, Path.cwd() / root, datasets_root() / root]
    found = next((c for c in candidates if c.is_dir()), candidates[0])
    return found.resolve()


# ------------------------------------------------------------------------------------------ images
def entry_path(root: str | Path, entry: str) -> Path:
    """An image folder or list named in data.yaml, resolved against the dataset root."""
    path = Path(entry).expanduser()
    if path.is_absolute():
        return path
    candidate = Path(root) / path
    if not candidate.exists() and entry.startswith("../") and (Path(root) / entry[3:]).exists():
        # Roboflow exports put data.yaml in the dataset folder and write `train: ../train/images`
        return Path(root) / entry[3:]
    return candidate


def list_image_files(root: str | Path, entries: Sequence[str], problems: DatasetProblems) -> list[str]:
    """The image files of a split, in order: each folder searched recursively and sorted, each .txt
    list line by line (relative lines are relative to `root`). A missing entry is a FileNotFoundError
    (recorded in a collecting `problems` log)."""
    files: list[str] = []
    for entry in entries:
        path = entry_path(root, entry)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*") if p.is_file())
            images = [f for f in found if f.lower().endswith(IMAGE_SUFFIXES)]
            if len(found) > len(images):
                logger.info(
                    f"{path}: {len(found) - len(images)} files without an image extension "
                    f"{IMAGE_SUFFIXES} left out"
                )
            files += images
        elif path.is_file():
            for line in path.read_text().splitlines():
                line = line.strip()
                if line:
                    file = Path(line).expanduser()
                    files.append(str(file if file.is_absolute() else Path(root) / file))
        else:
            problems.error(
                "missing image folder or list",
                f"YOLO dataset {root}: the images {entry!r} ({path}) are neither a folder nor a file list",
                FileNotFoundError,
            )
    return files


def _note_unpaired_labels(
    root: str, entries: Sequence[str], files: list[str], problems: DatasetProblems
) -> None:
    """Note label files in the label folders of image-folder entries that belong to no listed image
    (an image deleted, renamed or given another extension)."""
    paired = {label_path(f) for f in files}
    for entry in entries:
        folder = entry_path(root, entry)
        if not folder.is_dir():
            continue
        labels = Path(label_path(str(folder / "x"))).parent
        if labels == folder:  # no images/ folder: labels sit beside the images
            continue
        for txt in sorted(labels.rglob("*.txt")) if labels.is_dir() else []:
            if str(txt) not in paired:
                problems.note(
                    "label file without an image", f"{txt}: no image of the split has this label file"
                )


def label_path(image_file: str) -> str:
    """The Ultralytics label file of an image: last `/images/` -> `/labels/`, extension -> `.txt`."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    head, sep, tail = image_file.rpartition(sa)
    swapped = head + sb + tail if sep else image_file
    return os.path.splitext(swapped)[0] + ".txt"


def _try_size(path: str) -> tuple[int, int] | str | None:
    """image_size, None for a missing file, or the error text for an unreadable one."""
    if not os.path.isfile(path):
        return None
    if os.path.getsize(path) == 0:
        return "the file is empty (0 bytes)"
    try:
        return image_size(path)
    except (OSError, ValueError) as err:
        # what Pillow cannot open (a format it lacks) OpenCV may still decode
        try:
            return read_image(path).shape[:2]
        except CorruptImageError as bad:
            return f"{bad} (Pillow: {err})"


# ------------------------------------------------------------------------------------------ labels
class _BadLine(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _BadLine("malformed label line", f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise _BadLine("malformed label line", f"{text!r} is not a finite number")
    return value


def _coord(value: float) -> float:
    if not -COORD_TOLERANCE <= value <= 1 + COORD_TOLERANCE:
        raise _BadLine(
            "malformed label line",
            f"coordinate {value:g} is outside [0, 1] (YOLO labels are normalised by the image size)",
        )
    return min(max(value, 0.0), 1.0)


def parse_label_line(parts: Sequence[str], num_classes: int, keypoints: bool = False) -> list[float]:
    """[cls, cx, cy, w, h] (normalised) of one label line split into values; _BadLine if unusable.

    5 values: a box. An odd count >= 7: a polygon `cls x1 y1 ... xn yn`, converted to its bounding
    box. `keypoints`: a pose line, the box is its first five values.
    """
    if keypoints and len(parts) > 5:
        parts = parts[:5]
    if len(parts) != 5 and (len(parts) < 7 or len(parts) % 2 == 0):
        raise _BadLine(
            "malformed label line",
            f"{len(parts)} values: neither a box (class cx cy w h) nor a polygon "
            "(class x1 y1 x2 y2 x3 y3 ..., 3 points or more)",
        )
    values = [_number(p) for p in parts]
    cls = values[0]
    if not cls.is_integer() or not 0 <= cls < num_classes:
        raise _BadLine("unknown class id", f"class id {parts[0]} is not in 0..{num_classes - 1}")
    coords = [_coord(v) for v in values[1:]]
    if len(parts) == 5:
        return [cls, *coords]
    xs, ys = coords[0::2], coords[1::2]
    x1, x2, y1, y2 = min(xs), max(xs), min(ys), max(ys)
    return [cls, (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]


def parse_label_file(
    path: str, num_classes: int, problems: DatasetProblems, keypoints: bool = False
) -> tuple[np.ndarray, list[int]]:
    """Labels (K, 5) float64 [cls, cx, cy, w, h] normalised, and the 1-based line number of each.

    A missing file is a background image (no labels). Each bad line is reported to `problems`
    naming `path:line` (a strict log raises ValueError on the first); a collecting log skips it.
    """
    if not os.path.isfile(path):
        return np.zeros((0, 5)), []
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        problems.error("malformed label line", f"{path}: cannot read the label file: {err}")
        return np.zeros((0, 5)), []
    rows, lines = [], []
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            rows.append(parse_label_line(parts, num_classes, keypoints))
        except _BadLine as bad:
            problems.error(bad.kind, f"{path}:{number}: {bad} (line {line.strip()!r})")
            continue
        lines.append(number)
    return np.array(rows, dtype=np.float64).reshape(-1, 5), lines


# ------------------------------------------------------------------------------------------ dataset
class YOLODataset(DetectionDataset):
    """A split of an Ultralytics YOLO-format set (see the module docstring for the layout and checks).

    `images`: the split's entries of data.yaml (folders or .txt lists, relative to `root`).
    `img_id` is the image's position in the split's listing. Image sizes come from the file headers.
    `.coco` is the split as an in-memory pycocotools COCO (category id = class index + 1, as in
    `.class_ids`), so the COCO evaluator scores a YOLO set unchanged.
    """

    def __init__(
        self,
        root: str,
        images: str | Sequence[str],
        class_names: Sequence[str],
        img_size: tuple[int, int] = (640, 640),
        name: str = "yolo",
        skip_corrupt: bool = False,
        problems: DatasetProblems | None = None,
        keypoints: bool = False,
        for_eval: bool = False,
    ) -> None:
        problems = problems if problems is not None else DatasetProblems()
        self.root = str(root)
        self.for_eval = for_eval
        entries = [images] if isinstance(images, str) else list(images)
        split = f"YOLO {', '.join(entries)}"
        if not os.path.isdir(self.root):
            raise FileNotFoundError(
                f"YOLO dataset root not found: {self.root} (data.yaml's `path` is tried against the yaml's "
                "folder, the working directory and $YOLOX_DATADIR)"
            )
        self.class_ids = list(range(1, len(class_names) + 1))
        files = list_image_files(self.root, entries, problems)
        if problems.collect:
            _note_unpaired_labels(self.root, entries, files, problems)
        self._unreadable: dict[str, str] = {}  # file -> why its header cannot be read
        index = self._index(files, len(class_names), split, skip_corrupt, problems, keypoints)
        super().__init__(
            name, index, class_names, img_size, split=split, skip_corrupt=skip_corrupt, problems=problems
        )
        # an image found damaged at the start counts towards max_corrupt_fraction as one found in training
        if self._unreadable:
            for i, file in enumerate(self.index.files()):
                if file in self._unreadable:
                    self.damaged.mark(i, f"{split}: cannot read image {file}: {self._unreadable[file]}")

    def _index(
        self,
        files: list[str],
        num_classes: int,
        split: str,
        skip_corrupt: bool,
        problems: DatasetProblems,
        keypoints: bool,
    ) -> DatasetIndex:
        with ThreadPoolExecutor(HEADER_THREADS) as pool:
            sizes = list(pool.map(_try_size, files))
        # with skip_corrupt, training skips bad label lines and says how many in one line
        line_log = problems if problems.collect or not skip_corrupt else DatasetProblems(collect=True)
        clip = BoxClipCounter(problems, scored_as_given=self.for_eval)
        records = IndexBuilder()
        for img_id, (file, size) in enumerate(zip(files, sizes)):
            labels_file = label_path(file)
            labels, lines = parse_label_file(labels_file, num_classes, line_log, keypoints)
            if isinstance(size, str):
                # kept without boxes (its labels cannot be placed) and marked damaged once the split exists;
                # the checker names its damage by kind where it reads the image, as for any other format
                self._unreadable[file] = size
                labels, lines, size = labels[:0], [], (1, 1)
            if size is None:  # missing: DetectionDataset drops it (or stops, naming it)
                labels, lines = labels[:0], []
            height, width = size if size is not None else (0, 0)
            boxes = np.empty((len(labels), 4), dtype=np.float32)
            boxes[:, 0] = (labels[:, 1] - labels[:, 3] / 2) * width
            boxes[:, 1] = (labels[:, 2] - labels[:, 4] / 2) * height
            boxes[:, 2] = (labels[:, 1] + labels[:, 3] / 2) * width
            boxes[:, 3] = (labels[:, 2] + labels[:, 4] / 2) * height
            classes = labels[:, 0].astype(np.int64)
            raw = (boxes.copy(), classes, np.zeros(len(classes), dtype=bool))
            keep = clip.clip(boxes, width, height, lambda k, f=labels_file, n=lines: f"{f}:{n[k]}")
            changed = not keep.all() or not np.array_equal(raw[0], boxes)
            records.add(
                ImageRecord(
                    img_id=img_id,
                    file=file,
                    height=height,
                    width=width,
                    boxes=boxes[keep],
                    classes=classes[keep],
                    difficult=np.zeros(int(keep.sum()), dtype=bool),
                    raw_gt=raw if changed else None,
                )
            )
        if line_log is not problems and line_log.count():
            first = next(k.examples[0] for k in line_log.kinds.values())
            logger.warning(f"{split}: skipped {line_log.count()} bad label lines (first: {first})")
        clip.report(split)
        return records.build()

    @cached_property
    def coco(self) -> COCO:
        """The split's ground truth as a pycocotools COCO, built in memory (no file written)."""
        return records_to_coco(self.records, self.class_ids, self.class_names, self.root)


def val_image_dir(cfg: dict[str, Any]) -> str:
    """The folder holding a YOLO description's validation images: the val entry itself when it is one
    folder, else the deepest folder common to every listed val image."""
    entries = cfg["val"]["images"]
    first = entry_path(cfg["root"], entries[0])
    if len(entries) == 1 and first.is_dir():
        return str(first)
    files = list_image_files(cfg["root"], entries, DatasetProblems())
    if not files:
        raise FileNotFoundError(f"the val split of {cfg.get('config_path', cfg['root'])} lists no images")
    return os.path.commonpath([os.path.dirname(f) for f in files])


# ------------------------------------------------------------------------------------------ writing
def _link_or_copy(src: str, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copyfile(src, dst)


def write_yolo_dataset(out: str | Path, splits: Mapping[str, DetectionDataset]) -> Path:
    """Write `splits` ({"train": dataset, "val": dataset}, any format) as a YOLO-format set at `out`.

    Images are hard-linked (copied across file systems) to `out/images/<split>/`, boxes written as
    `out/labels/<split>/<stem>.txt` ("class cx cy w h", normalised, 6 decimals: 1e-6 of the image
    side); images without boxes get no label file. Writes into a temporary folder renamed to `out`
    at the end (a previous `out` is replaced). Returns the path of `out/data.yaml` (no `path` key:
    the root is the yaml's folder, so the set can be moved).
    """
    out = Path(out)
    names = [tuple(ds.class_names) for ds in splits.values()]
    if len(set(names)) != 1:
        raise ValueError(f"the splits have different class names: {names}")
    tmp = out.parent / f"{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for split, dataset in splits.items():
        img_dir, label_dir = tmp / "images" / split, tmp / "labels" / split
        img_dir.mkdir(parents=True)
        label_dir.mkdir(parents=True)
        used: set[str] = set()  # stems: a.jpg and a.png would share a label file
        for rec in dataset.records:
            src = Path(rec.file)
            name = src.name if src.stem not in used else f"{src.stem}_{rec.img_id}{src.suffix}"
            used.add(Path(name).stem)
            _link_or_copy(str(src), img_dir / name)
            if len(rec.boxes):
                b = rec.boxes.astype(np.float64)
                cx, cy = (b[:, 0] + b[:, 2]) / 2 / rec.width, (b[:, 1] + b[:, 3]) / 2 / rec.height
                w, h = (b[:, 2] - b[:, 0]) / rec.width, (b[:, 3] - b[:, 1]) / rec.height
                lines = "".join(
                    f"{c} {x:.6f} {y:.6f} {bw:.6f} {bh:.6f}\n"
                    for c, x, y, bw, bh in zip(rec.classes.tolist(), cx, cy, w, h)
                )
                (label_dir / f"{Path(name).stem}.txt").write_text(lines)
    description = {
        **{split: f"images/{split}" for split in splits},
        "nc": len(names[0]),
        "names": list(names[0]),
    }
    (tmp / "data.yaml").write_text(yaml.safe_dump(description, sort_keys=False))
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    return out / "data.yaml"
