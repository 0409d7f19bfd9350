"""MosaicDetection: the YOLOX training view of a dataset — 4-image mosaic, random affine, MixUp."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
from torch.utils.data import Dataset

from yolox_fast.data.augment import (
    PAD_VALUE,
    TrainTransform,
    clip_and_filter,
    random_affine,
    resize_keep_ratio,
)

# A loader item: (mosaic on?, dataset index, per-sample seed words). Carrying the mosaic flag in the
# item (set by the batch sampler in the main process) is what lets close_mosaic reach persistent workers.
Item = tuple[bool, int, Sequence[int]]


def mosaic_placement(
    k: int, xc: int, yc: int, w: int, h: int, input_h: int, input_w: int
) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """Where tile k (0 tl, 1 tr, 2 bl, 3 br) of size (h, w) goes on the (2*input_h, 2*input_w) canvas
    around the centre (xc, yc): (canvas x1, y1, x2, y2), (tile x1, y1, x2, y2). Tiles touch the centre
    and are cut only at the canvas border."""
    if k == 0:
        big = (max(xc - w, 0), max(yc - h, 0), xc, yc)
        small = (w - (big[2] - big[0]), h - (big[3] - big[1]), w, h)
    elif k == 1:
        big = (xc, max(yc - h, 0), min(xc + w, 2 * input_w), yc)
        small = (0, h - (big[3] - big[1]), min(w, big[2] - big[0]), h)
    elif k == 2:
        big = (max(xc - w, 0), yc, xc, min(2 * input_h, yc + h))
        small = (w - (big[2] - big[0]), 0, w, min(big[3] - big[1], h))
    else:
        big = (xc, yc, min(xc + w, 2 * input_w), min(2 * input_h, yc + h))
        small = (0, 0, min(w, big[2] - big[0]), min(big[3] - big[1], h))
    return big, small


class MosaicDetection(Dataset):
    """Training samples from a DetectionDataset: with probability mosaic_prob a mosaic of 4 images
    (then random affine and, with mixup_prob, MixUp with a fifth), else one image; then
    `preproc` (HSV, flip, letterbox). Boxes are clipped and filtered after every geometric step.

    `__getitem__` takes an `Item` (mosaic flag, index, seed words) from YoloBatchSampler, or a plain
    index (mosaic per `enable_mosaic`, seeded by `seed` and the index). Returns (img float32
    (3, H, W), labels (K, 5) [cls, cx, cy, w, h] px, img_info, img_id); img_info is (w, h) of the
    mosaic output for mosaic samples (as YOLOX) and the original (h, w) otherwise.
    """

    def __init__(
        self,
        dataset,
        img_size: tuple[int, int],
        mosaic: bool = True,
        preproc: TrainTransform | None = None,
        degrees: float = 10.0,
        translate: float = 0.1,
        mosaic_scale: Sequence[float] = (0.5, 1.5),
        mixup_scale: Sequence[float] = (0.5, 1.5),
        shear: float = 2.0,
        enable_mixup: bool = True,
        mosaic_prob: float = 1.0,
        mixup_prob: float = 1.0,
        box_filter: tuple[float, float, float] = (2.0, 0.1, 20.0),
        seed: int = 0,
    ) -> None:
        self._dataset = dataset
        self.img_size = tuple(img_size)
        self.enable_mosaic = mosaic
        self.preproc = preproc or TrainTransform(box_filter=box_filter)
        self.degrees, self.translate, self.shear = degrees, translate, shear
        self.mosaic_scale, self.mixup_scale = mosaic_scale, mixup_scale
        self.enable_mixup = enable_mixup
        self.mosaic_prob, self.mixup_prob = mosaic_prob, mixup_prob
        self.box_filter = box_filter
        self.seed = seed
        # MixUp needs a partner with boxes; an image set with none at all simply gets no MixUp
        self._labelled = np.array([i for i in range(len(dataset)) if len(dataset.records[i].boxes)])

    def __len__(self) -> int:
        return len(self._dataset)

    @property
    def dataset(self):
        return self._dataset

    @property
    def class_names(self):
        return self._dataset.class_names

    def __getitem__(self, item: int | Item):
        if isinstance(item, (tuple, list)):
            mosaic, index, seed_words = item
        else:
            mosaic, index, seed_words = self.enable_mosaic, int(item), (self.seed, int(item))
        rng = np.random.default_rng(list(seed_words))
        if mosaic and rng.random() < self.mosaic_prob:
            img, labels, img_id = self._mosaic(index, rng)
            if self.enable_mixup and len(labels) and len(self._labelled) and rng.random() < self.mixup_prob:
                img, labels = self._mixup(img, labels, rng)
            out, targets = self.preproc(img, labels, self.img_size, rng)
            return out, targets, (img.shape[1], img.shape[0]), img_id
        img, labels, info, img_id = self._dataset.pull_item(index)
        out, targets = self.preproc(img, labels, self.img_size, rng)
        return out, targets, info, img_id

    def _fit(self, img: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Resize a pulled image to fit img_size (a no-op when the dataset already did)."""
        img, r = resize_keep_ratio(img, self.img_size)
        if r != 1:
            labels = labels.copy()
            labels[:, :4] *= r
        return img, labels

    def _mosaic(self, index: int, rng: np.random.Generator):
        input_h, input_w = self.img_size
        yc = int(rng.uniform(0.5 * input_h, 1.5 * input_h))
        xc = int(rng.uniform(0.5 * input_w, 1.5 * input_w))
        indices = [index] + rng.integers(0, len(self._dataset), 3).tolist()
        canvas = np.full((2 * input_h, 2 * input_w, 3), PAD_VALUE, dtype=np.uint8)
        all_labels = []
        first_id = None
        for k, idx in enumerate(indices):
            img, labels, _, img_id = self._dataset.pull_item(idx)
            first_id = img_id if first_id is None else first_id
            img, labels = self._fit(img, labels)
            h, w = img.shape[:2]
            (bx1, by1, bx2, by2), (sx1, sy1, sx2, sy2) = mosaic_placement(k, xc, yc, w, h, input_h, input_w)
            canvas[by1:by2, bx1:bx2] = img[sy1:sy2, sx1:sx2]
            labels = labels.copy()
            labels[:, [0, 2]] += bx1 - sx1
            labels[:, [1, 3]] += by1 - sy1
            all_labels.append(labels)
        labels = clip_and_filter(np.concatenate(all_labels), 2 * input_w, 2 * input_h, *self.box_filter)
        img, labels = random_affine(
            canvas,
            labels,
            rng,
            self.img_size,
            self.degrees,
            self.translate,
            self.mosaic_scale,
            self.shear,
            self.box_filter,
        )
        return img, labels, first_id

    def _mixup(self, origin_img: np.ndarray, origin_labels: np.ndarray, rng: np.random.Generator):
        jitter = rng.uniform(*self.mixup_scale)
        flip = rng.random() > 0.5
        cp_img, cp_labels, _, _ = self._dataset.pull_item(
            int(self._labelled[rng.integers(len(self._labelled))])
        )
        input_h, input_w = self.img_size
        resized, ratio = resize_keep_ratio(cp_img, self.img_size)
        cp_canvas = np.full((input_h, input_w, 3), PAD_VALUE, dtype=np.uint8)
        cp_canvas[: resized.shape[0], : resized.shape[1]] = resized
        cp_canvas = cv2.resize(cp_canvas, (int(input_w * jitter), int(input_h * jitter)))
        ratio *= jitter
        if flip:
            cp_canvas = cp_canvas[:, ::-1]
        oh, ow = cp_canvas.shape[:2]
        th, tw = origin_img.shape[:2]
        padded = np.zeros((max(oh, th), max(ow, tw), 3), dtype=np.uint8)
        padded[:oh, :ow] = cp_canvas
        y_off = int(rng.integers(0, padded.shape[0] - th)) if padded.shape[0] > th else 0
        x_off = int(rng.integers(0, padded.shape[1] - tw)) if padded.shape[1] > tw else 0
        crop = padded[y_off : y_off + th, x_off : x_off + tw]

        boxes = cp_labels[:, :4] * ratio
        if flip:
            boxes[:, [0, 2]] = ow - boxes[:, [2, 0]]
        boxes[:, [0, 2]] -= x_off
        boxes[:, [1, 3]] -= y_off
        new_labels = np.concatenate([boxes, cp_labels[:, 4:5]], axis=1)
        new_labels = clip_and_filter(new_labels, tw, th, *self.box_filter)
        img = cv2.addWeighted(origin_img, 0.5, np.ascontiguousarray(crop), 0.5, 0.0)
        return img, np.concatenate([origin_labels, new_labels.astype(np.float32)])
