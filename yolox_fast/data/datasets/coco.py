"""COCODataset: any COCO-format json plus an image folder, read into a DatasetIndex once per machine; and the
COCO rules a description needs: where an annotation file lies, which of its categories train."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger
from pycocotools.coco import COCO

from yolox_fast.data.datasets.base import BoxClipCounter, DetectionDataset
from yolox_fast.data.datasets.coco_json import read_coco_json
from yolox_fast.data.datasets.consistency import check_coco_ids, file_sizes, fill_coco_defaults
from yolox_fast.data.datasets.index import DatasetIndex, encode_strings, offsets_of
from yolox_fast.data.datasets.index_store import stored_index
from yolox_fast.data.datasets.problems import DatasetProblems

# the scoring ground truth a COCO index carries besides the training boxes: every annotation with a
# usable box, crowd ones included, in file order (what COCOeval reads of the file and nothing more)
TRUTH = ("gt_ann_ids", "gt_image_ids", "gt_category_ids", "gt_bbox", "gt_area", "gt_iscrowd")


def coco_category_names(cfg: dict[str, Any], path: Path | str | None = None) -> list[str]:
    """Class names of a COCO-format description from its annotation files' categories, sorted by id
    (an export's unused supercategory left out, see `trained_categories`)."""
    # val first: it is the small file (COCO train annotations are ~450 MB)
    for split in ("val", "train"):
        ann = annotation_path(cfg["root"], cfg[split]["ann"])
        if os.path.isfile(ann):
            st = os.stat(ann)
            return list(_trained_category_names(ann, st.st_size, st.st_mtime_ns))
    raise FileNotFoundError(
        f"dataset description {path or cfg.get('config_path')} has no class_names and no annotation file to "
        f"read them from (looked for {cfg['val']['ann']} and {cfg['train']['ann']} under "
        f"{cfg['root']}/annotations and {cfg['root']})"
    )


@functools.lru_cache(maxsize=8)
def _trained_category_names(ann: str, size: int, mtime_ns: int) -> tuple[str, ...]:
    """The trained category names of an annotation file, parsed once per process for each (size, mtime):
    a run asks for the class names several times, and a `data_dir` set's description leaves them to the
    annotation file."""
    return tuple(c["name"] for c in trained_categories(read_coco_json(ann))[0])


def trained_categories(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the categories to train, sorted by id; those left out) of a COCO annotation dict.

    Left out: a category that another category names as its supercategory and that no annotation of
    the file uses. Roboflow's COCO exports carry one (id 0, the dataset's name, the supercategory of
    every real class); trained, it would be a class no box ever has.
    """
    cats = sorted(data.get("categories") or [], key=lambda c: c["id"])
    used = {a.get("category_id") for a in data.get("annotations") or []}
    parents = {c.get("supercategory") for c in cats} - {None}
    dropped = [
        c
        for c in cats
        if c["id"] not in used
        and c.get("name") in parents
        and any(o.get("supercategory") == c.get("name") and o is not c for o in cats)
    ]
    return [c for c in cats if c not in dropped], dropped


def annotation_path(root: str, ann: str) -> str:
    """A COCO annotation file: `ann` itself if absolute, else `<root>/annotations/<ann>` (YOLOX's layout)
    when that exists, else `<root>/<ann>` when that does (exports such as Roboflow's keep the json beside
    the images: `train/_annotations.coco.json`); YOLOX's path when neither exists."""
    if os.path.isabs(ann):
        return ann
    yolox_layout = os.path.join(root, "annotations", ann)
    beside = os.path.join(root, ann)
    if not os.path.isfile(yolox_layout) and os.path.isfile(beside):
        return beside
    return yolox_layout


class COCODataset(DetectionDataset):
    """COCO-format detection set.

    `class_ids[i]` is the category id of contiguous class i (categories sorted by id); `class_names`
    come from the json categories unless `class_names` is given (then it must have one name per
    category). `.coco` is the pycocotools COCO the COCO evaluator scores against, built when first asked
    for from the index's scoring ground truth (the json is not read again).
    Crowd annotations are left out of the training targets, as in YOLOX. An annotation with an
    unknown category id or without a 4-number bbox is an error naming its id (with a collecting
    `problems` log: recorded and left out). Annotations whose image_id names no image are counted and
    named: left out with a warning, an error when they are all the split has. `for_eval`: the split is
    scored (its log lines say how out-of-image boxes count). `index_dir`: where the parsed index is kept
    (see `index_store`); a collecting `problems` log always parses the file afresh.
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
        index_dir: str | None = None,
    ) -> None:
        problems = problems if problems is not None else DatasetProblems()
        ann_path = annotation_path(root, ann_file)
        self.ann_path = ann_path
        self.for_eval = for_eval
        image_dir = os.path.join(root, images)
        if not os.path.isfile(ann_path):
            raise FileNotFoundError(f"COCO annotation file not found: {ann_path}")

        def build() -> DatasetIndex:
            return coco_index(read_coco_json(ann_path), ann_path, image_dir, problems)

        if problems.collect:
            index = build()
        else:
            index, _ = stored_index(ann_path, {"reader": "coco", "images": image_dir}, build, index_dir)
        for level, message in index.meta["log"]:
            logger.log(level, message)
        BoxClipCounter.restored(index.meta["clip"], scored_as_given=for_eval).report(ann_path)
        self.class_ids = list(index.meta["class_ids"])
        if class_names is not None and len(class_names) != len(self.class_ids):
            raise ValueError(
                f"{ann_path} has {len(self.class_ids)} categories but the dataset description lists "
                f"{len(class_names)} class names"
            )
        names = list(class_names) if class_names is not None else list(index.meta["class_names"])
        self._coco: COCO | None = None
        super().__init__(
            name, index, names, img_size, split=ann_path, skip_corrupt=skip_corrupt, problems=problems
        )

    @property
    def coco(self) -> COCO:
        """The split's scoring ground truth as a pycocotools COCO, built once when first asked for."""
        if self._coco is None:
            self._coco = coco_truth(self.index)
        return self._coco

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_coco"] = None  # a loader worker never scores: it does not need rank 0's ground truth
        return state


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bboxes(anns: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """((A, 4) float64 bbox of every annotation, NaN where unusable; (A,) bool usable)."""
    raw = [a.get("bbox") for a in anns]
    if all(type(b) is list and len(b) == 4 for b in raw):
        table = np.array(raw) if raw else np.zeros((0, 4))
        if table.dtype.kind in "iuf" and table.shape == (len(raw), 4) and np.isfinite(table).all():
            return table.astype(np.float64), np.ones(len(raw), dtype=bool)
    # some box is not four finite numbers: find which, one annotation at a time
    ok = np.array([isinstance(b, list) and len(b) == 4 and all(map(_finite, b)) for b in raw], dtype=bool)
    table = np.full((len(raw), 4), np.nan)
    if ok.any():
        table[ok] = np.array([b for b, good in zip(raw, ok) if good], dtype=np.float64)
    return table, ok


def _column(anns: list[dict], key: str, default, dtype) -> np.ndarray:
    return np.array([a.get(key, default) for a in anns], dtype=dtype)


def coco_index(
    data: dict[str, Any], ann_path: str, image_dir: str, problems: DatasetProblems
) -> DatasetIndex:
    """The DatasetIndex of a parsed COCO annotation dict: images sorted by id, each with its non-crowd
    usable boxes (x1, y1, x2, y2 clipped to the image, boxless ones dropped) in file order, plus the
    scoring ground truth (TRUTH). Bad annotations are reported to `problems` (see COCODataset);
    `meta` keeps the class ids and names, the parse's log lines and the clip counts."""
    images = data.get("images") or []
    if not images:
        raise ValueError(f"{ann_path}: the split has no images")
    anns = data.get("annotations") or []
    check_coco_ids(images, anns, ann_path, problems)
    fill_coco_defaults(anns, ann_path, problems)
    log: list[tuple[str, str]] = []
    cats, dropped = trained_categories(data)
    if dropped:
        log.append(
            (
                "INFO",
                f"{ann_path}: categories {[(c['id'], c['name']) for c in dropped]} are the supercategory of "
                "the others and no annotation uses them (an export's dataset-level category): not trained",
            )
        )
    class_ids = [c["id"] for c in cats]

    # images: one per id, sorted by id (a repeated id keeps its last entry, as pycocotools' index does)
    ids_in_file = np.array([im["id"] for im in images], dtype=np.int64)
    ids, last_reversed = np.unique(ids_in_file[::-1], return_index=True)
    chosen = [images[len(images) - 1 - j] for j in last_reversed.tolist()]
    names = [im.get("file_name") or f"{im['id']:012d}.jpg" for im in chosen]
    files = [os.path.join(image_dir, name) for name in names]
    # each image at its file's size where the json gives another or none (read from the headers once per
    # index, in parallel: about 3 s for COCO's train2017)
    sizes = file_sizes(
        [(f, im.get("width"), im.get("height")) for f, im in zip(files, chosen)], ann_path, problems
    )
    for k in [k for k, size in enumerate(sizes) if size is None]:
        problems.error(
            "image without size",
            f"{ann_path}: image id {chosen[k]['id']} ({files[k]}) has no width and height, and its file "
            "cannot be read for them",
            FileNotFoundError,
        )
    sized = [k for k, size in enumerate(sizes) if size is not None]
    if len(sized) < len(chosen):
        ids, chosen = ids[sized], [chosen[k] for k in sized]
        names, files = [names[k] for k in sized], [files[k] for k in sized]
        sizes = [sizes[k] for k in sized]
    heights = np.array([h for h, _ in sizes], dtype=np.int32)
    widths = np.array([w for _, w in sizes], dtype=np.int32)
    position = {int(i): p for p, i in enumerate(ids.tolist())}

    # annotations: columns over the file, then masks
    contiguous = {cat_id: i for i, cat_id in enumerate(class_ids)}
    cls = np.array([contiguous.get(a.get("category_id"), -1) for a in anns], dtype=np.int64)
    img_pos = np.array([position.get(a.get("image_id"), -1) for a in anns], dtype=np.int64)
    bbox, box_ok = _bboxes(anns)
    ann_ids = _column(anns, "id", 0, np.int64)
    crowd = np.array([bool(a.get("iscrowd", 0)) for a in anns], dtype=bool)
    area = np.array([a.get("area", np.nan) for a in anns], dtype=np.float64)
    _report_bad(anns, ann_path, class_ids, cls >= 0, box_ok, problems)
    usable = (cls >= 0) & box_ok
    orphans = np.flatnonzero(usable & (img_pos < 0))
    if len(orphans):
        _report_orphans(anns, orphans, ann_path, problems, log)
    usable &= img_pos >= 0

    # training boxes: the usable non-crowd ones, grouped by image (file order within an image)
    train = np.flatnonzero(usable & ~crowd)
    train = train[np.argsort(img_pos[train], kind="stable")]
    x, y, w, h = bbox[train].T
    boxes = np.stack([x, y, x + w, y + h], axis=1).astype(np.float32)  # (B, 4)
    owner = img_pos[train]  # (B,) image position of each box
    clip = BoxClipCounter(problems)

    def where(k: int) -> str:
        return f"annotation id {ann_ids[train[k]]} ({names[owner[k]]})"

    keep = clip.clip(boxes, widths[owner], heights[owner], where)
    boxes, owner, train = boxes[keep], owner[keep], train[keep]
    file_bytes, file_offsets = encode_strings(files)
    n = len(ids)
    arrays = {
        "img_ids": ids,
        "heights": heights,
        "widths": widths,
        "file_bytes": file_bytes,
        "file_offsets": file_offsets,
        "box_offsets": offsets_of(np.bincount(owner, minlength=n)),
        "boxes": boxes,
        "classes": cls[train],
        "difficult": np.zeros(len(train), dtype=bool),
        "raw_offsets": np.zeros(n + 1, dtype=np.int64),  # COCO scores its TRUTH arrays, not raw_gt
        "raw_boxes": np.zeros((0, 4), dtype=np.float32),
        "raw_classes": np.zeros(0, dtype=np.int64),
        "raw_difficult": np.zeros(0, dtype=bool),
    }
    scored = np.flatnonzero(usable)
    arrays.update(
        {
            "gt_ann_ids": ann_ids[scored],
            "gt_image_ids": ids[img_pos[scored]],
            "gt_category_ids": np.array(class_ids, dtype=np.int64)[cls[scored]],
            "gt_bbox": bbox[scored],  # (G, 4) x, y, w, h as the file gives them
            "gt_area": area[scored],  # NaN where the file gives none
            "gt_iscrowd": crowd[scored],
        }
    )
    meta = {
        "class_ids": class_ids,
        "class_names": [c["name"] for c in cats],
        "categories": [{"id": c["id"], "name": c["name"]} for c in data.get("categories") or []],
        "log": log,
        "clip": clip.counts(),
    }
    return DatasetIndex(arrays, meta)


def _report_bad(
    anns: list[dict],
    ann_path: str,
    class_ids: list[int],
    cat_ok: np.ndarray,
    box_ok: np.ndarray,
    problems: DatasetProblems,
) -> None:
    """Annotations with an unknown category or an unusable bbox, in file order (a strict log raises on
    the first)."""
    for k in np.flatnonzero(~(cat_ok & box_ok)).tolist():
        ann = anns[k]
        if not cat_ok[k]:
            problems.error(
                "unknown category id",
                f"{ann_path}: annotation id {ann.get('id')} has category id {ann.get('category_id')}, "
                f"which is not among the file's categories {class_ids}",
            )
        else:
            problems.error(
                "malformed annotation",
                f"{ann_path}: annotation id {ann.get('id')} has bbox {ann.get('bbox')!r}, not [x, y, w, h]",
            )


def _report_orphans(
    anns: list[dict], orphans: np.ndarray, ann_path: str, problems: DatasetProblems, log: list
) -> None:
    """Annotations whose image_id names no image would vanish from training and scoring: say so."""
    for k in orphans.tolist():
        problems.note(
            "orphan annotation",
            f"{ann_path}: annotation id {anns[k].get('id')} names image id {anns[k].get('image_id')}, "
            "not among the images",
        )
    first = ", ".join(
        f"annotation id {anns[k].get('id')} (image_id {anns[k].get('image_id')})" for k in orphans[:3]
    )
    msg = (
        f"{ann_path}: {len(orphans)} of {len(anns)} annotations name an image_id that no image of the "
        f"file has (first: {first})"
    )
    if len(orphans) == len(anns) and not problems.collect:
        raise ValueError(f"{msg}: the split has no usable box left. Are the image ids shifted?")
    log.append(("WARNING", f"{msg}; they are left out"))


def coco_truth(index: DatasetIndex) -> COCO:
    """A pycocotools COCO holding what COCOeval reads of a COCO index's split: its images (id, size,
    file) and the TRUTH annotations, built in memory (the json is not read)."""
    images = [
        {"id": i, "width": w, "height": h, "file_name": os.path.basename(index.file(p))}
        for p, (i, w, h) in enumerate(
            zip(index.img_ids.tolist(), index.widths.tolist(), index.heights.tolist())
        )
    ]
    annotations = []
    columns = zip(
        index.gt_ann_ids.tolist(),
        index.gt_image_ids.tolist(),
        index.gt_category_ids.tolist(),
        index.gt_bbox.tolist(),
        index.gt_area.tolist(),
        index.gt_iscrowd.tolist(),
    )
    for ann_id, img_id, cat_id, bbox, area, crowd in columns:
        ann = {"id": ann_id, "image_id": img_id, "category_id": cat_id, "bbox": bbox, "iscrowd": int(crowd)}
        if not math.isnan(area):  # pycocotools needs it, and says so, where the file has none
            ann["area"] = area
        annotations.append(ann)
    coco = COCO()
    coco.dataset = {"images": images, "annotations": annotations, "categories": index.meta["categories"]}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    return coco
