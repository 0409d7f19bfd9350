"""DetectionDataset: what COCO, VOC and YOLO datasets share once their annotations are parsed into records."""

from __future__ import annotations

import contextlib
import io
import os
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
from loguru import logger
from pycocotools.coco import COCO
from torch.utils.data import Dataset

from yolox_fast.data.augment import PAD_VALUE, fitted_size, letterbox_chw, resize_keep_ratio
from yolox_fast.data.datasets.damaged import DamagedImages
from yolox_fast.data.datasets.index import DatasetIndex, ImageRecord, RecordView
from yolox_fast.data.datasets.problems import ERROR, DatasetProblems
from yolox_fast.data.image_io import CorruptImageError, read_image

__all__ = ["BoxClipCounter", "CorruptImageError", "DetectionDataset", "ImageRecord", "records_to_coco"]


class BoxClipCounter:
    """Counts boxes that stick out of their image or have no area while records are built; `report`
    logs one line naming the first of each.

    Training clips such boxes and drops the empty ones. An evaluation split (`scored_as_given`) keeps
    them for the metric exactly as the annotation file has them (pycocotools and the VOC devkit score
    the raw file, and so AP stays comparable), and its line says so. With a collecting `problems` log,
    every zero-size box (an error: it was annotated without area) and every box reaching outside its
    image (a warning) is also noted there by name.
    """

    def __init__(self, problems: DatasetProblems | None = None, scored_as_given: bool = False) -> None:
        self.scored_as_given = scored_as_given
        self.clipped = 0
        self.dropped = 0
        self.first_clipped: str | None = None
        self.first_dropped: str | None = None
        self.problems = problems

    def clip(self, boxes: np.ndarray, width, height, where: Callable[[int], str]) -> np.ndarray:
        """Clip boxes (K, 4) in place to their image; returns the (K,) mask of boxes with area left.

        `width` and `height` are the image's (ints), or each box's image's ((K,) arrays: a whole split
        at once). `where(k)` names box k (annotation id, file) for the log line.
        """
        width = np.broadcast_to(np.asarray(width), (len(boxes),))
        height = np.broadcast_to(np.asarray(height), (len(boxes),))
        clipped = boxes.copy()
        clipped[:, [0, 2]] = clipped[:, [0, 2]].clip(0, width[:, None])
        clipped[:, [1, 3]] = clipped[:, [1, 3]].clip(0, height[:, None])
        moved = (clipped != boxes).any(1)
        if moved.any():
            self.clipped += int(moved.sum())
            if self.first_clipped is None:
                self.first_clipped = where(int(np.argmax(moved)))
        if self.problems is not None and self.problems.collect:
            self._note(boxes, clipped, moved, width, height, where)
        boxes[:] = clipped
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        if not keep.all():
            self.dropped += int((~keep).sum())
            if self.first_dropped is None:
                self.first_dropped = where(int(np.argmin(keep)))
        return keep

    def _note(self, boxes, clipped, moved, width: np.ndarray, height: np.ndarray, where) -> None:
        zero = (boxes[:, 2] <= boxes[:, 0]) | (boxes[:, 3] <= boxes[:, 1])
        for k in np.flatnonzero(zero):
            self.problems.note("zero-size box", f"{where(k)}: box {_fmt_box(boxes[k])} has no area", ERROR)
        for k in np.flatnonzero(moved & ~zero):
            gone = clipped[k, 2] <= clipped[k, 0] or clipped[k, 3] <= clipped[k, 1]
            fate = "lies entirely outside it (dropped)" if gone else "reaches outside it (clipped)"
            box = _fmt_box(boxes[k])
            size = f"{width[k]}x{height[k]}"
            self.problems.note("box outside its image", f"{where(k)}: box {box} in a {size} image {fate}")

    def counts(self) -> dict:
        """What `report` says, as a JSON-able dict (kept with a saved index, see `restored`)."""
        keys = ("clipped", "dropped", "first_clipped", "first_dropped")
        return {k: getattr(self, k) for k in keys}

    @classmethod
    def restored(cls, counts: dict, scored_as_given: bool = False) -> BoxClipCounter:
        """A counter holding `counts()` of an earlier parse, so a split read from its saved index logs
        the same line as the parse did."""
        counter = cls(scored_as_given=scored_as_given)
        for key, value in counts.items():
            setattr(counter, key, value)
        return counter

    def report(self, split: str) -> None:
        if not (self.clipped or self.dropped):
            return
        parts = []
        if self.clipped:
            parts.append(f"{self.clipped} boxes extend outside their image (first: {self.first_clipped})")
        if self.dropped:
            parts.append(f"{self.dropped} boxes have no area inside it (first: {self.first_dropped})")
        if self.scored_as_given:
            action = (
                "the metric scores them as the annotation file gives them (as pycocotools and the VOC "
                "devkit do); they are clipped and dropped for drawing only"
            )
        else:
            action = "for training they are clipped to the image, and those with no area left are dropped"
        logger.warning(f"{split}: {'; '.join(parts)}: {action}")


def records_to_coco(
    records: Sequence[ImageRecord], class_ids: Sequence[int], class_names: Sequence[str], root: str
) -> COCO:
    """Records as an in-memory pycocotools COCO (no file written), so the COCO metric scores any format.

    Boxes are scored as the annotation file gives them (`raw_gt`); a VOC "difficult" box becomes a crowd
    box, which COCOeval ignores as the VOC devkit ignores difficult ones. `class_ids[i]` is the category
    id of class index i; file names are relative to `root`.
    """
    images, annotations = [], []
    for rec in records:
        images.append(
            {
                "id": rec.img_id,
                "file_name": os.path.relpath(rec.file, root),
                "width": rec.width,
                "height": rec.height,
            }
        )
        boxes, classes, difficult = rec.raw_gt or (rec.boxes, rec.classes, rec.difficult)
        for (x1, y1, x2, y2), cls, hard in zip(boxes.tolist(), classes.tolist(), difficult.tolist()):
            w, h = x2 - x1, y2 - y1
            annotations.append(
                {
                    "id": len(annotations) + 1,  # pycocotools reads id 0 as "unmatched"
                    "image_id": rec.img_id,
                    "category_id": class_ids[cls],
                    "bbox": [x1, y1, w, h],
                    "area": w * h,
                    "iscrowd": int(hard),
                }
            )
    categories = [{"id": cid, "name": n} for cid, n in zip(class_ids, class_names)]
    coco = COCO()
    coco.dataset = {"images": images, "annotations": annotations, "categories": categories}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    return coco


def existing_files(files: Sequence[str]) -> set[str]:
    """Those of `files` that exist as files, found with one listing per folder instead of one stat per
    file: 118k stats take minutes on a network file system, a listing of their folder a second. A name
    the listing lacks is still asked for by itself (a case-insensitive file system finds `A.JPG` as
    `a.jpg`)."""
    by_folder: dict[str, list[str]] = defaultdict(list)
    for file in files:
        by_folder[os.path.dirname(file)].append(file)
    present: set[str] = set()
    for folder, in_folder in by_folder.items():
        try:
            with os.scandir(folder or ".") as entries:
                listed = {e.name for e in entries if e.is_file()}
        except OSError:  # no such folder, or not readable: none of its files can be read
            continue
        present.update(f for f in in_folder if os.path.basename(f) in listed or os.path.isfile(f))
    return present


def _fmt_box(box: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:g}" for v in np.round(box.astype(np.float64), 2)) + "]"


class DetectionDataset(Dataset):
    """Images with boxes, resized for training (`pull_item`) or letterboxed for evaluation (`__getitem__`).

    The images and boxes are a DatasetIndex of flat arrays (`index`); `records` reads it as ImageRecords
    built on demand, so the dataset holds no Python object per image.

    `img_size` (H, W): training images are resized keeping aspect to fit it (what mosaic and the cache
    use); evaluation items are letterboxed to it. An image that cannot be decoded whole is skipped with
    one warning and marked in `damaged` (shared with the loader workers; the trainer decides when too
    many are). With `skip_corrupt` a missing image file is skipped instead of an error. With a collecting
    `problems` log (the dataset checker) missing image files are recorded there and left out.
    """

    _warned_orientation = False

    def __init__(
        self,
        name: str,
        index: DatasetIndex,
        class_names: Sequence[str],
        img_size: tuple[int, int],
        split: str,
        skip_corrupt: bool = False,
        problems: DatasetProblems | None = None,
    ) -> None:
        self.name = name
        self.class_names = tuple(class_names)
        self.img_size = tuple(img_size)
        self.split = split
        self.skip_corrupt = skip_corrupt
        self.problems = problems if problems is not None else DatasetProblems()
        self.index = self._drop_missing(index)
        if not len(self.index):
            raise ValueError(f"{split}: the split has no images")
        self.cache = None
        self.damaged = DamagedImages(self.index.file, len(self.index), split)

    @property
    def records(self) -> RecordView:
        """The images as ImageRecords, each built from the index when read (none is kept)."""
        return RecordView(self.index)

    @property
    def ids(self) -> list[int]:
        """The image ids, in dataset order."""
        return self.index.img_ids.tolist()

    def box_counts(self) -> np.ndarray:
        """(N,) the number of training boxes of each image."""
        return self.index.box_counts

    def _drop_missing(self, index: DatasetIndex) -> DatasetIndex:
        files = index.files()
        present = existing_files(files)
        missing = [f for f in files if f not in present]
        if not missing:
            return index
        if self.problems.collect:
            for file in missing:
                self.problems.error("missing image", f"{self.split}: image file not found: {file}")
        elif len(missing) == len(files) and len(files) > 1:
            folders = sorted({os.path.dirname(f) for f in missing})
            raise FileNotFoundError(
                f"{self.split}: none of the {len(files)} images it names is in {', '.join(folders[:3])} "
                f"(first: {os.path.basename(missing[0])}): are the images elsewhere, or the description's "
                "images folder another?"
            )
        elif not self.skip_corrupt:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise FileNotFoundError(f"{self.split}: image file not found: {missing[0]}{more}")
        else:
            logger.warning(f"{self.split}: skipping {len(missing)} missing image files (first: {missing[0]})")
        return index.subset(np.array([f in present for f in files], dtype=bool))

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def image_files(self) -> list[str]:
        return self.index.files()

    def attach_cache(self, cache) -> None:
        """Serve `load_resized_img` from an ImageCache built over this dataset at `img_size`."""
        self.cache = cache

    def load_image(self, index: int) -> np.ndarray:
        """The original BGR uint8 image (h, w, 3) in the frame its boxes were drawn in; CorruptImageError
        naming the file if undecodable.

        OpenCV turns a photo upright by its EXIF orientation. LabelImg draws on the pixels as stored, so a
        phone photo stored sideways has its boxes and <size> in the stored frame: when the decoded image is
        the annotation's size turned by 90 degrees, it is read again as stored, and the boxes fit it.
        """
        rec = self.index.record(index)
        if not os.path.isfile(rec.file):
            raise FileNotFoundError(f"{self.split}: image file not found: {rec.file}")
        img = read_image(rec.file)
        if img.shape[:2] == (rec.width, rec.height) and rec.width != rec.height:
            stored = read_image(rec.file, ignore_orientation=True)
            if stored.shape[:2] == (rec.height, rec.width):
                if not DetectionDataset._warned_orientation:
                    DetectionDataset._warned_orientation = True
                    logger.warning(
                        f"{rec.file} is stored sideways with an EXIF orientation and annotated as stored (as "
                        "LabelImg does): such images are read as stored so that their boxes fit. Logged once."
                    )
                img = stored
        return img

    def load_resized_img(self, index: int) -> np.ndarray:
        """The image resized keeping aspect to fit img_size (from the cache when attached)."""
        if self.cache is not None:
            img = self.cache.get(index)
            if img is not None:
                return img
            raise CorruptImageError(
                f"{self.index.file(index)}: could not be decoded when the cache was built"
            )
        return resize_keep_ratio(self.load_image(index), self.img_size)[0]

    def load_anno(self, index: int) -> np.ndarray:
        """Labels (K, 5) [x1, y1, x2, y2, cls] scaled like `load_resized_img`."""
        rec = self.index.record(index)
        r = min(self.img_size[0] / rec.height, self.img_size[1] / rec.width)
        labels = np.empty((len(rec.boxes), 5), dtype=np.float32)
        labels[:, :4] = rec.boxes * r
        labels[:, 4] = rec.classes
        return labels

    def resized_size(self, index: int) -> tuple[int, int]:
        """(h, w) of `load_resized_img(index)`, from the annotation's image size (nothing is decoded)."""
        hw = (int(self.index.heights[index]), int(self.index.widths[index]))
        return fitted_size(hw, self.img_size)[:2]

    def pull_item(
        self, index: int, with_image: bool = True
    ) -> tuple[np.ndarray | None, np.ndarray, tuple[int, int], int]:
        """(resized uint8 image (a private copy: augmentations write into it), labels (K, 5),
        (orig h, orig w), img_id).

        A damaged image is replaced by the next decodable one (and marked in `damaged`).
        `with_image=False`: the image is None and not read (a mosaic tile the warp never samples);
        the rest is that of `index` itself.
        """
        if not with_image:
            rec = self.index.record(index)
            return None, self.load_anno(index), (rec.height, rec.width), rec.img_id
        for offset in range(len(self)):
            i = (index + offset) % len(self)
            if i in self.damaged:  # known already: not decoded again
                continue
            try:
                img = self.load_resized_img(i)
                if self.cache is not None:  # a view of the shared cache; a decoded image is fresh already
                    img = np.array(img)
            except CorruptImageError as err:
                self.damaged.mark(i, str(err))
                continue
            rec = self.index.record(i)
            return img, self.load_anno(i), (rec.height, rec.width), rec.img_id
        raise CorruptImageError(f"{self.split}: no image of the split can be decoded")

    def __getitem__(self, index: int):
        """Evaluation item: (img float32 (3, H, W) letterboxed to img_size, target (K, 5)
        [x1, y1, x2, y2, cls] original px, (orig h, orig w), img_id).

        A damaged image is replaced by a blank (PAD_VALUE) canvas: it is marked in `damaged`, and its
        ground truth still counts as missed, so the metric stays honest.
        """
        rec = self.index.record(index)
        try:
            img, _ = letterbox_chw(self.load_image(index), self.img_size)
        except CorruptImageError as err:
            self.damaged.mark(index, str(err))
            img = np.full((3, *self.img_size), PAD_VALUE, dtype=np.float32)
        target = np.concatenate([rec.boxes, rec.classes[:, None].astype(np.float32)], axis=1)
        return img, target.astype(np.float32), (rec.height, rec.width), rec.img_id
