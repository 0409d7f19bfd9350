"""VOCDetection: Pascal VOC XML annotations, one file per image, in the layouts people have them.

A split of a VOC-format description (`root` is the dataset folder) is one of:

    {"sets": [["2007", "trainval"], ["2012", "test"]]}   VOCdevkit: VOC<year>/ImageSets/Main/<set>.txt
    {"list": "ImageSets/Main/train.txt"}     the images a text file names (stems or file names, one a line)
    {"csv": "data/train_labels.csv"}         the images of a CSV's `filename` column (CSV box exports)
    {}                                       every XML file of the annotations folder
    {"val_ratio": 0.2, "split_seed": 0, "part": "val"}   a fixed share of them (see `ratio_split`)

Outside VOCdevkit, a split (or the description's top level) may name its `images` and `annotations`
folders, relative to root (default `JPEGImages` and `Annotations`; one folder for both is fine: LabelImg
saves each XML beside its image). Relative list and CSV paths are relative to root. An image is found as
the XML's <filename> in the images folder, else as `<xml stem>.<any image extension>` there (exports
rename files and leave <filename> alone); LabelImg's <folder> and <path> name the labeller's machine and
are not used.
"""

from __future__ import annotations

import csv
import hashlib
import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from yolox_fast.data.datasets.base import BoxClipCounter, DetectionDataset, ImageRecord, records_to_coco
from yolox_fast.data.datasets.consistency import (
    check_shared_images,
    fitted_size,
    read_header,
    report_size_mismatches,
)
from yolox_fast.data.datasets.index import DatasetIndex, IndexBuilder, encode_strings
from yolox_fast.data.datasets.problems import DatasetProblems

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
DEFAULT_IMAGES = "JPEGImages"
DEFAULT_ANNOTATIONS = "Annotations"


def ratio_split(stems: Sequence[str], val_ratio: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, val) stems: the round(val_ratio * N) stems of smallest sha1(f"{seed}:{stem}") are val.

    A pure function of the names, so the same images are the validation set on every machine and in
    every run; adding images moves none of the old ones from val to train except the few the new
    ones outrank. Both lists keep the order of `stems`.
    """
    if not 0 < val_ratio < 1:
        raise ValueError(f"val_ratio must be between 0 and 1 (exclusive), got {val_ratio}")
    rank = sorted(stems, key=lambda s: hashlib.sha1(f"{seed}:{s}".encode()).hexdigest())
    n_val = min(max(round(val_ratio * len(stems)), 1), len(stems) - 1) if len(stems) > 1 else 0
    val = set(rank[:n_val])
    return [s for s in stems if s not in val], [s for s in stems if s in val]


def _entry_stem(entry: str) -> str:
    """The image stem a list or CSV entry names: `a.jpg`, `dir/a.jpg`, `a.xml` and `a` all give `a`
    (a bare `a.b` is the stem `a.b`: VOC lists hold stems, which may contain dots)."""
    name = os.path.basename(entry.strip().replace("\\", "/"))
    root, ext = os.path.splitext(name)
    return root if ext.lower() in (*IMAGE_SUFFIXES, ".xml") else name


def _read_list(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"VOC split list not found: {path}")
    with open(path) as f:
        stems = [_entry_stem(line.split()[0]) for line in f if line.strip()]
    if not stems:
        raise ValueError(f"VOC split list {path} lists no images (empty split)")
    return list(dict.fromkeys(stems))


def _read_csv(path: str) -> list[str]:
    """The distinct images of a CSV's `filename` column (one row per box, as box CSV exports write)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"split CSV not found: {path}")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns = {c.strip().lower(): c for c in reader.fieldnames or []}
        if "filename" not in columns:
            raise ValueError(
                f"split CSV {path} has no `filename` column (its header: {reader.fieldnames}); the split "
                "needs one row per image or box naming the image"
            )
        stems = [_entry_stem(row[columns["filename"]]) for row in reader if row[columns["filename"]].strip()]
    if not stems:
        raise ValueError(f"split CSV {path} names no images (empty split)")
    return list(dict.fromkeys(stems))


def _xml_stems(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"VOC annotation folder not found: {folder}")
    stems = sorted(p.stem for p in Path(folder).iterdir() if p.suffix.lower() == ".xml" and p.is_file())
    if not stems:
        raise ValueError(f"VOC annotation folder {folder} holds no .xml files (empty split)")
    return stems


def split_folders(root: str, split: Mapping[str, Any]) -> tuple[str, str]:
    """(images folder, annotations folder) of a non-VOCdevkit split, relative to root (default
    JPEGImages and Annotations; `read_description` copies the description's top-level ones in)."""
    images = split.get("images", DEFAULT_IMAGES)
    annotations = split.get("annotations", DEFAULT_ANNOTATIONS)
    return os.path.join(root, images), os.path.join(root, annotations)


def split_entries(
    root: str, split: Mapping[str, Any] | Sequence[Sequence[str]]
) -> list[tuple[str, str, str]]:
    """The (xml file, images folder, split label) of every image a split names, in order."""
    if not isinstance(split, Mapping):
        split = {"sets": split}
    if "sets" in split:
        entries = []
        for year, name in split["sets"]:
            year_dir = os.path.join(root, f"VOC{year}")
            for stem in _read_list(os.path.join(year_dir, "ImageSets", "Main", f"{name}.txt")):
                entries.append((os.path.join(year_dir, "Annotations", f"{stem}.xml"), year_dir, str(year)))
        return [(xml, os.path.join(d, "JPEGImages"), year) for xml, d, year in entries]
    images, annotations = split_folders(root, split)
    if "list" in split:
        stems = _read_list(os.path.join(root, split["list"]))
    elif "csv" in split:
        stems = _read_csv(os.path.join(root, split["csv"]))
    else:
        stems = _xml_stems(annotations)
        if "val_ratio" in split:
            train, val = ratio_split(stems, float(split["val_ratio"]), int(split.get("split_seed", 0)))
            stems = val if split.get("part") == "val" else train
    return [(os.path.join(annotations, f"{stem}.xml"), images, "") for stem in stems]


def describe_split(split: Mapping[str, Any] | Sequence[Sequence[str]]) -> str:
    """A split as its log lines name it: `VOC2007/trainval`, `list ImageSets/Main/train.txt`, ..."""
    if not isinstance(split, Mapping):
        split = {"sets": split}
    if "sets" in split:
        return ", ".join(f"VOC{y}/{s}" for y, s in split["sets"])
    if "list" in split:
        return f"list {split['list']}"
    if "csv" in split:
        return f"csv {split['csv']}"
    where = split.get("annotations", DEFAULT_ANNOTATIONS)
    if "val_ratio" in split:
        return (
            f"{split.get('part', 'train')} part of {where} (val_ratio {split['val_ratio']}, split_seed "
            f"{split.get('split_seed', 0)})"
        )
    return f"every XML of {where}"


def folder_listing(folder: str) -> frozenset[str]:
    """The names of the files in `folder` (empty if it cannot be listed): one listing answers every
    "is this image there?" of a split, where a stat per candidate name takes minutes on a network file
    system at 100k images."""
    try:
        with os.scandir(folder) as entries:
            return frozenset(e.name for e in entries if e.is_file())
    except OSError:
        return frozenset()


def find_image(
    images_dir: str, file_name: str | None, stem: str, listing: frozenset[str] | None = None
) -> str | None:
    """The image of an XML: `<images_dir>/<file_name>`, else `<images_dir>/<stem>.<ext>`; None if neither.
    `listing`: the file names in images_dir (`folder_listing`), looked up instead of a stat per name."""

    def there(name: str) -> bool:
        if listing is not None and "/" not in name:
            return name in listing
        return os.path.isfile(os.path.join(images_dir, name))

    if file_name:
        given = file_name.strip().replace("\\", "/")
        for name in (given, os.path.basename(given)):
            if there(name):
                return os.path.join(images_dir, name)
    for ext in IMAGE_SUFFIXES:
        for candidate in (f"{stem}{ext}", f"{stem}{ext.upper()}"):
            if there(candidate):
                return os.path.join(images_dir, candidate)
    return None


def xml_class_names(root: str, splits: Sequence[Mapping[str, Any] | Sequence[Sequence[str]]]) -> list[str]:
    """The sorted object names of every XML the splits name (the class list of a set whose description
    gives none). Unreadable files are skipped here: reading the split reports them."""
    names: set[str] = set()
    for split in splits:
        for xml_path, _, _ in split_entries(root, split):
            try:
                tree = ET.parse(xml_path).getroot()
            except (OSError, ET.ParseError):
                continue
            names.update((obj.findtext("name") or "").strip() for obj in tree.iter("object"))
    names.discard("")
    if not names:
        raise ValueError(
            f"no object names in the XML files under {root}: give class_names in the description"
        )
    return sorted(names)


class VOCDetection(DetectionDataset):
    """A VOC-XML split (see the module docstring for `split`); a list of (year, set) pairs is the
    VOCdevkit form.

    Class names come from the dataset description (or the XML files, `xml_class_names`); an object
    whose name is not among them is an error naming the XML file. VOC boxes are 1-based inclusive
    pixel indices; records hold pixel-edge coordinates (x1 = xmin - 1, x2 = xmax). `img_id` is the
    position in the dataset; `image_names[i]` = (year, file stem) for writing VOC results. A missing
    or invalid XML file, an XML whose image is not there, an unknown class name or a malformed
    <bndbox> is an error naming the file (with a collecting `problems` log: recorded, and the image
    or object left out). `.coco` and `.class_ids` (1..K) serve the COCO metric.
    """

    def __init__(
        self,
        root: str,
        split: Mapping[str, Any] | Sequence[Sequence[str]],
        class_names: Sequence[str],
        img_size: tuple[int, int] = (640, 640),
        name: str = "voc",
        skip_corrupt: bool = False,
        problems: DatasetProblems | None = None,
        for_eval: bool = False,
    ) -> None:
        self.root = root
        self.for_eval = for_eval
        self.class_ids = list(range(1, len(class_names) + 1))
        label = describe_split(split)
        problems = problems if problems is not None else DatasetProblems()
        index = self._index(split_entries(root, split), class_names, problems, label)
        self._coco = None
        super().__init__(
            name, index, class_names, img_size, split=label, skip_corrupt=skip_corrupt, problems=problems
        )

    def _index(
        self,
        entries: list[tuple[str, str, str]],
        class_names: Sequence[str],
        problems: DatasetProblems,
        label,
    ) -> DatasetIndex:
        index = {n: i for i, n in enumerate(class_names)}
        clip = BoxClipCounter(problems, scored_as_given=self.for_eval)
        builder = IndexBuilder()
        names = []  # "year/stem" of each image kept, for VOC result files
        xml_files, image_files, mismatched = [], [], []
        listings: dict[str, frozenset[str]] = {}
        for xml_path, images_dir, year in entries:
            if images_dir not in listings:
                listings[images_dir] = folder_listing(images_dir)
            rec = self._parse(
                xml_path, images_dir, len(builder), index, clip, problems, mismatched, listings[images_dir]
            )
            if rec is not None:
                builder.add(rec)
                names.append(f"{year}/{Path(xml_path).stem}")
                xml_files.append(xml_path)
                image_files.append(rec.file)
        clip.report(label)
        report_size_mismatches(mismatched, problems)
        check_shared_images(image_files, xml_files, "VOC annotation", problems)
        name_bytes, name_offsets = encode_strings(names)
        return builder.build({"name_bytes": name_bytes, "name_offsets": name_offsets})

    @property
    def image_names(self) -> list[tuple[str, str]]:
        """(year, XML stem) of each image, for writing VOC results (year "" outside VOCdevkit)."""
        names = (self.index.string("name", i) for i in range(len(self)))
        return [tuple(n.split("/", 1)) for n in names]

    @staticmethod
    def _parse(
        xml_path: str,
        images_dir: str,
        img_id: int,
        index: dict,
        clip: BoxClipCounter,
        problems: DatasetProblems,
        mismatched: list[str],
        listing: frozenset[str] | None = None,
    ) -> ImageRecord | None:
        """The record of one image, or None when its XML is unusable (collecting `problems` only). A
        <size> that differs from the image file's is added to `mismatched` (consistency.fitted_size);
        `listing`: the file names of images_dir (see `find_image`)."""
        if not os.path.isfile(xml_path):
            problems.error("missing annotation", f"VOC annotation not found: {xml_path}", FileNotFoundError)
            return None
        try:
            tree = ET.parse(xml_path).getroot()
        except ET.ParseError as err:
            problems.error("malformed annotation", f"VOC annotation {xml_path} is not valid XML: {err}")
            return None
        file_name = tree.findtext("filename")
        img_file = find_image(images_dir, file_name, Path(xml_path).stem, listing)
        if img_file is None:
            looked = os.path.join(images_dir, file_name or f"{Path(xml_path).stem}.jpg")
            problems.error(
                "missing image",
                f"{xml_path} names the image {file_name!r}, which is not in {images_dir} (looked for "
                f"{looked} and {Path(xml_path).stem}.* there)",
                FileNotFoundError,
            )
            return None
        size = tree.find("size")
        width = height = 0
        if size is not None and size.findtext("width"):
            width, height = int(float(size.findtext("width"))), int(float(size.findtext("height")))
        # some exports omit <size> or write 0: the image header gives it
        header = read_header(img_file, (height, width) if width > 0 and height > 0 else None)
        fitted, mismatch = fitted_size(img_file, width, height, header, xml_path, problems)
        if fitted is None:
            problems.error(
                "unreadable image",
                f"{xml_path} has no usable <size> and its image cannot be read: {img_file}",
                FileNotFoundError,
            )
            return None
        if mismatch:
            mismatched.append(mismatch)
        height, width = fitted
        boxes, classes, difficult, objects = [], [], [], []
        for k, obj in enumerate(tree.iter("object")):
            cls_name = (obj.findtext("name") or "").strip()
            if cls_name not in index:
                problems.error(
                    "unknown class",
                    f"{xml_path}: object #{k} has class {cls_name!r}, not among the dataset's class names "
                    f"{list(index)}",
                )
                continue
            bb = obj.find("bndbox")
            try:
                xmin, ymin, xmax, ymax = (float(bb.findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax"))
            except (AttributeError, TypeError, ValueError):
                problems.error(
                    "malformed annotation", f"{xml_path}: object #{k} has no <bndbox> with 4 numeric corners"
                )
                continue
            boxes.append([xmin - 1, ymin - 1, xmax, ymax])
            classes.append(index[cls_name])
            difficult.append(obj.findtext("difficult", "0").strip() == "1")
            objects.append(k)
        boxes_np = np.array(boxes, dtype=np.float32).reshape(-1, 4)
        classes_np, difficult_np = np.array(classes, dtype=np.int64), np.array(difficult, dtype=bool)
        raw = (boxes_np.copy(), classes_np, difficult_np)
        keep = clip.clip(boxes_np, width, height, lambda k: f"{xml_path} object #{objects[k]}")
        changed = not keep.all() or not np.array_equal(raw[0], boxes_np)
        return ImageRecord(
            img_id=img_id,
            file=img_file,
            height=height,
            width=width,
            boxes=boxes_np[keep],
            classes=classes_np[keep],
            difficult=difficult_np[keep],
            raw_gt=raw if changed else None,
        )

    @property
    def coco(self):
        """The split's ground truth as an in-memory pycocotools COCO (difficult boxes as crowd: ignored)."""
        if self._coco is None:
            self._coco = records_to_coco(self.records, self.class_ids, self.class_names, self.root)
        return self._coco


def log_ratio_split(name: str, root: str, split: Mapping[str, Any]) -> None:
    """Say how a val_ratio split divided the annotated images (once, at the start of a run)."""
    stems = _xml_stems(split_folders(root, split)[1])
    train, val = ratio_split(stems, float(split["val_ratio"]), int(split.get("split_seed", 0)))
    logger.info(
        f"{name}: {len(stems)} annotated images split by val_ratio {split['val_ratio']} and split_seed "
        f"{split.get('split_seed', 0)}: {len(train)} train, {len(val)} val (the same on every run; "
        f"first val images: {', '.join(val[:3])})"
    )
