"""COCODataset: any COCO-format json (pycocotools) plus an image folder."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from collections.abc import Sequence

import numpy as np
from loguru import logger
from pycocotools.coco import COCO

from yolox_fast.data.config import annotation_path, trained_categories
from yolox_fast.data.datasets.base import BoxClipCounter, DetectionDataset, ImageRecord
from yolox_fast.data.datasets.consistency import check_coco_ids, file_sizes, fill_coco_defaults
from yolox_fast.data.datasets.problems import DatasetProblems


class COCODataset(DetectionDataset):
    """COCO-format detection set.

    `class_ids[i]` is the category id of contiguous class i (categories sorted by id); `class_names`
    come from the json categories unless `class_names` is given (then it must have one name per
    category). `.coco` is the pycocotools COCO object the COCO evaluator scores against.
    Crowd annotations are left out of the training targets, as in YOLOX. An annotation with an
    unknown category id or without a 4-number bbox is an error naming its id (with a collecting
    `problems` log: recorded and left out). Annotations whose image_id names no image are counted and
    named: left out with a warning, an error when they are all the split has. `for_eval`: the split is
    scored (its log lines say how out-of-image boxes count).
    """

    def __init__(
        self,
        root: str,
        images: str,
        ann_file: str,
        img_size: tuple[int, int] = (640, 640),
        class_names: Sequence[str] | None = None,
        name: str = "coco",
        skip_corrupt: bool = False,
        problems: DatasetProblems | None = None,
        for_eval: bool = False,
    ) -> None:
        problems = problems if problems is not None else DatasetProblems()
        ann_path = annotation_path(root, ann_file)
        self.ann_path = ann_path
        self.coco = load_coco(ann_path)
        data = self.coco.dataset
        check_coco_ids(data["images"], data.get("annotations", []), ann_path, problems)
        fill_coco_defaults(data.get("annotations", []), ann_path, problems)
        self.for_eval = for_eval
        cats, dropped = trained_categories(self.coco.dataset)
        if dropped:
            logger.info(
                f"{ann_path}: categories {[(c['id'], c['name']) for c in dropped]} are the supercategory of "
                "the others and no annotation uses them (an export's dataset-level category): not trained"
            )
        self.class_ids = [c["id"] for c in cats]
        if class_names is not None and len(class_names) != len(cats):
            raise ValueError(
                f"{ann_path} has {len(cats)} categories but the dataset description lists "
                f"{len(class_names)} class names"
            )
        names = list(class_names) if class_names is not None else [c["name"] for c in cats]
        image_dir = os.path.join(root, images)
        records = self._records(image_dir, problems)
        super().__init__(
            name, records, names, img_size, split=ann_path, skip_corrupt=skip_corrupt, problems=problems
        )

    def _usable(self, problems: DatasetProblems) -> set:
        """Ids of the annotations that can be trained on; the others are reported to `problems`."""
        contiguous = set(self.class_ids)
        usable, orphans = set(), []
        for ann in self.coco.dataset.get("annotations", []):
            if ann.get("category_id") not in contiguous:
                problems.error(
                    "unknown category id",
                    f"{self.ann_path}: annotation id {ann.get('id')} has category id "
                    f"{ann.get('category_id')}, which is not among the file's categories {self.class_ids}",
                )
                continue
            bbox = ann.get("bbox")
            if not (isinstance(bbox, list) and len(bbox) == 4 and all(_finite(v) for v in bbox)):
                problems.error(
                    "malformed annotation",
                    f"{self.ann_path}: annotation id {ann.get('id')} has bbox {bbox!r}, not [x, y, w, h]",
                )
                continue
            if ann.get("image_id") not in self.coco.imgs:
                orphans.append(ann)
                problems.note(
                    "orphan annotation",
                    f"{self.ann_path}: annotation id {ann.get('id')} names image id {ann.get('image_id')}, "
                    "not among the images",
                )
                continue
            usable.add(ann.get("id"))
        if orphans:
            self._report_orphans(orphans, problems)
        return usable

    def _report_orphans(self, orphans: list[dict], problems: DatasetProblems) -> None:
        """Annotations whose image_id names no image would vanish from training and scoring: say so."""
        total = len(self.coco.dataset.get("annotations", []))
        first = ", ".join(f"annotation id {a.get('id')} (image_id {a.get('image_id')})" for a in orphans[:3])
        msg = (
            f"{self.ann_path}: {len(orphans)} of {total} annotations name an image_id that no image of the "
            f"file has (first: {first})"
        )
        if len(orphans) == total and not problems.collect:
            raise ValueError(f"{msg}: the split has no usable box left. Are the image ids shifted?")
        logger.warning(f"{msg}; they are left out")

    def _records(self, image_dir: str, problems: DatasetProblems) -> list[ImageRecord]:
        img_ids = sorted(self.coco.getImgIds())
        if not img_ids:
            raise ValueError(f"{self.ann_path}: the split has no images")
        contiguous = {cat_id: i for i, cat_id in enumerate(self.class_ids)}
        usable = self._usable(problems)
        clip = BoxClipCounter(problems, scored_as_given=self.for_eval)
        records = []
        infos = [self.coco.imgs[img_id] for img_id in img_ids]
        names = [info.get("file_name") or f"{img_id:012d}.jpg" for img_id, info in zip(img_ids, infos)]
        entries = [
            (os.path.join(image_dir, n), i.get("width"), i.get("height")) for n, i in zip(names, infos)
        ]
        for img_id, file_name, size in zip(img_ids, names, file_sizes(entries, self.ann_path, problems)):
            if size is None:
                problems.error(
                    "image without size",
                    f"{self.ann_path}: image id {img_id} ({file_name}) has no width and height, and its file "
                    "cannot be read for them",
                    FileNotFoundError,
                )
                continue
            h, w = size
            anns = self.coco.loadAnns(self.coco.getAnnIds(imgIds=[img_id], iscrowd=False))
            anns = [a for a in anns if a.get("id") in usable]
            boxes = np.array(
                [
                    [a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                    for a in anns
                ],
                dtype=np.float32,
            ).reshape(-1, 4)
            classes = np.array([contiguous[a["category_id"]] for a in anns], dtype=np.int64)
            keep = clip.clip(
                boxes, w, h, lambda k, anns=anns, f=file_name: f"annotation id {anns[k].get('id')} ({f})"
            )
            records.append(
                ImageRecord(
                    img_id=int(img_id),
                    file=os.path.join(image_dir, file_name),
                    height=h,
                    width=w,
                    boxes=boxes[keep],
                    classes=classes[keep],
                    difficult=np.zeros(int(keep.sum()), dtype=bool),
                )
            )
        clip.report(self.ann_path)
        return records


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_coco(ann_path: str) -> COCO:
    """pycocotools' COCO of an annotation file; a missing or unreadable file is an error naming it."""
    if not os.path.isfile(ann_path):
        raise FileNotFoundError(f"COCO annotation file not found: {ann_path}")
    try:
        with open(ann_path) as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"COCO annotation file {ann_path} is not valid JSON ({err}): truncated or not a COCO file?"
        ) from None
    if not isinstance(data, dict) or "images" not in data:
        raise ValueError(f"COCO annotation file {ann_path} has no 'images' list: not a COCO detection file")
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    return coco
