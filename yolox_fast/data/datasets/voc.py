"""VOCDetection: Pascal VOC XML annotations with ImageSets splits; several years/splits at once."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence

import cv2
import numpy as np

from yolox_fast.data.datasets.base import BoxClipCounter, DetectionDataset, ImageRecord
from yolox_fast.data.datasets.problems import DatasetProblems


class VOCDetection(DetectionDataset):
    """VOC-format detection set under `root` (a VOCdevkit folder holding VOC2007/, VOC2012/, ...).

    `sets` lists (year, split) pairs, e.g. [("2007", "trainval"), ("2012", "trainval")]; each reads
    `VOC<year>/ImageSets/Main/<split>.txt`. Class names come from the dataset description; an object
    whose name is not among them is an error naming the XML file. VOC boxes are 1-based inclusive
    pixel indices; records hold pixel-edge coordinates (x1 = xmin - 1, x2 = xmax). `img_id` is the
    position in the dataset; `image_names[i]` = (year, file stem) for writing VOC results.
    A missing or invalid XML file, an unknown class name or a malformed <bndbox> is an error naming
    the file (with a collecting `problems` log: recorded, and the image or object left out).
    """

    def __init__(
        self,
        root: str,
        sets: Sequence[Sequence[str]],
        class_names: Sequence[str],
        img_size: tuple[int, int] = (640, 640),
        name: str = "voc",
        skip_corrupt: bool = False,
        problems: DatasetProblems | None = None,
        for_eval: bool = False,
    ) -> None:
        self.root = root
        self.sets = [tuple(s) for s in sets]
        self.image_names: list[tuple[str, str]] = []
        self.for_eval = for_eval
        split = ", ".join(f"VOC{y}/{s}" for y, s in self.sets)
        problems = problems if problems is not None else DatasetProblems()
        records = self._records(class_names, problems)
        super().__init__(
            name, records, class_names, img_size, split=split, skip_corrupt=skip_corrupt, problems=problems
        )

    def _records(self, class_names: Sequence[str], problems: DatasetProblems) -> list[ImageRecord]:
        index = {n: i for i, n in enumerate(class_names)}
        clip = BoxClipCounter(problems, scored_as_given=self.for_eval)
        records: list[ImageRecord] = []
        for year, split in self.sets:
            year_dir = os.path.join(self.root, f"VOC{year}")
            list_file = os.path.join(year_dir, "ImageSets", "Main", f"{split}.txt")
            if not os.path.isfile(list_file):
                raise FileNotFoundError(f"VOC split list not found: {list_file}")
            with open(list_file) as f:
                stems = [line.split()[0] for line in f if line.strip()]
            if not stems:
                raise ValueError(f"VOC split {list_file} lists no images (empty split)")
            for stem in stems:
                rec = self._parse(year_dir, stem, len(records), index, clip, problems)
                if rec is not None:
                    records.append(rec)
                    self.image_names.append((year, stem))
        clip.report(", ".join(f"VOC{y}/{s}" for y, s in self.sets))
        return records

    @staticmethod
    def _parse(
        year_dir: str, stem: str, img_id: int, index: dict, clip: BoxClipCounter, problems: DatasetProblems
    ) -> ImageRecord | None:
        """The record of one image, or None when its XML is unusable (collecting `problems` only)."""
        xml_path = os.path.join(year_dir, "Annotations", f"{stem}.xml")
        if not os.path.isfile(xml_path):
            problems.error("missing annotation", f"VOC annotation not found: {xml_path}", FileNotFoundError)
            return None
        try:
            tree = ET.parse(xml_path).getroot()
        except ET.ParseError as err:
            problems.error("malformed annotation", f"VOC annotation {xml_path} is not valid XML: {err}")
            return None
        img_file = os.path.join(year_dir, "JPEGImages", tree.findtext("filename") or f"{stem}.jpg")
        size = tree.find("size")
        if size is not None and size.findtext("width"):
            width, height = int(float(size.findtext("width"))), int(float(size.findtext("height")))
        else:  # some VOC-style exports omit <size>: read it from the image
            img = cv2.imread(img_file)
            if img is None:
                problems.error(
                    "unreadable image",
                    f"{xml_path} has no <size> and its image cannot be read: {img_file}",
                    FileNotFoundError,
                )
                return None
            height, width = img.shape[:2]
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
