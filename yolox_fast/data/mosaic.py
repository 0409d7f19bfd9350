"""MosaicDetection: the YOLOX training view of a dataset — 4-image mosaic, random affine, MixUp."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
from torch.utils.data import Dataset

from yolox_fast.data.augment import (
    DEFAULT_BOX_FILTER,
    PAD_VALUE,
    TrainTransform,
    affine_matrix,
    clip_and_filter,
    fitted_size,
    letterbox,
    resize_keep_ratio,
    sampled_window,
    warp_affine,
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
    `transform` (HSV, flip, letterbox). Boxes are clipped and filtered after every geometric step.

    `__getitem__` takes an `Item` (mosaic flag, index, seed words) from YoloBatchSampler, or a plain
    index (mosaic per `enable_mosaic`, seeded by `seed` and the index). Returns (img uint8
    (3, H, W) as `TrainTransform` gives it, labels (K, 5) [cls, cx, cy, w, h] px, img_info, img_id);
    img_info is (w, h) of the mosaic output for mosaic samples (as YOLOX) and the original (h, w)
    otherwise.

    `dataset` provides `pull_item(index, with_image=True)` and `resized_size(index)` (see
    `DetectionDataset`), `records` (each with `.boxes`) and `class_names`.
    """

    def __init__(
        self,
        dataset,
        img_size: tuple[int, int],
        mosaic: bool = True,
        transform: TrainTransform | None = None,
        degrees: float = 10.0,
        translate: float = 0.1,
        mosaic_scale: Sequence[float] = (0.5, 1.5),
        mixup_scale: Sequence[float] = (0.5, 1.5),
        shear: float = 2.0,
        enable_mixup: bool = True,
        mosaic_prob: float = 1.0,
        mixup_prob: float = 1.0,
        box_filter: tuple[float, float, float] = DEFAULT_BOX_FILTER,
        seed: int = 0,
        affine_pivot: str = "centre",
    ) -> None:
        self._dataset = dataset
        self.img_size = tuple(img_size)
        self.enable_mosaic = mosaic
        self.transform = transform or TrainTransform(box_filter=box_filter)
        self.degrees, self.translate, self.shear = degrees, translate, shear
        self.mosaic_scale, self.mixup_scale = mosaic_scale, mixup_scale
        self.enable_mixup = enable_mixup
        self.mosaic_prob, self.mixup_prob = mosaic_prob, mixup_prob
        self.box_filter = box_filter
        self.seed = seed
        self.affine_pivot = affine_pivot
        # MixUp needs a partner with boxes; an image set with none at all simply gets no MixUp
        self._labelled = np.flatnonzero(dataset.box_counts())  # (L,) indices of the images with boxes

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
        # the same stream as np.random.default_rng(seed_words), built in half the time
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(seed_words))))
        if mosaic and rng.random() < self.mosaic_prob:
            img, labels, img_id = self._mosaic(index, rng)
            if self.enable_mixup and len(labels) and len(self._labelled) and rng.random() < self.mixup_prob:
                img, labels = self._mixup(img, labels, rng)
            out, targets = self.transform(img, labels, self.img_size, rng)
            return out, targets, (img.shape[1], img.shape[0]), img_id
        img, labels, info, img_id = self._dataset.pull_item(index)
        out, targets = self.transform(img, labels, self.img_size, rng)
        return out, targets, info, img_id

    def _mosaic(self, index: int, rng: np.random.Generator):
        input_h, input_w = self.img_size
        canvas_size = (2 * input_h, 2 * input_w)
        yc = int(rng.uniform(0.5 * input_h, 1.5 * input_h))
        xc = int(rng.uniform(0.5 * input_w, 1.5 * input_w))
        indices = [index] + rng.integers(0, len(self._dataset), 3).tolist()
        matrix = affine_matrix(
            rng,
            canvas_size,
            self.img_size,
            self.degrees,
            self.translate,
            self.mosaic_scale,
            self.shear,
            self.affine_pivot,
        )
        # The warp reads only a window of the 2x canvas (about 40% of it on average): only the
        # window is painted, and a tile on the far side of the centre from it is never decoded. The
        # warp still runs on the whole canvas with the same matrix (moving the origin would change
        # cv2's float32 rounding of the sample positions), so the output is the same pixel for pixel.
        # The canvas is BGRx: cv2 warps 4 channels in half the time of 3, and pastes a BGR tile into
        # the 4-channel ROI in one vectorised conversion.
        wx1, wy1, wx2, wy2 = sampled_window(matrix, canvas_size, self.img_size)
        canvas = np.empty((*canvas_size, 4), dtype=np.uint8)  # outside the window: never read
        canvas[wy1:wy2, wx1:wx2] = PAD_VALUE
        all_labels = []
        first_id = None
        for k, idx in enumerate(indices):
            left, top = k in (0, 2), k in (0, 1)
            seen = (wx1 < xc if left else wx2 > xc) and (wy1 < yc if top else wy2 > yc)
            img, labels, _, img_id = self._dataset.pull_item(idx, with_image=seen)
            first_id = img_id if first_id is None else first_id
            if seen:  # fitted to img_size (a no-op when the dataset already did)
                img, r = resize_keep_ratio(img, self.img_size)
                h, w = img.shape[:2]
            else:  # the size the decoded, fitted tile would have, from the annotation
                h, w, r = fitted_size(self._dataset.resized_size(idx), self.img_size)
            (bx1, by1, bx2, by2), (sx1, sy1, _, _) = mosaic_placement(k, xc, yc, w, h, input_h, input_w)
            x1, y1, x2, y2 = max(bx1, wx1), max(by1, wy1), min(bx2, wx2), min(by2, wy2)
            if seen and x1 < x2 and y1 < y2:  # the tile's part inside the window
                tile = img[y1 - by1 + sy1 : y2 - by1 + sy1, x1 - bx1 + sx1 : x2 - bx1 + sx1]
                cv2.cvtColor(tile, cv2.COLOR_BGR2BGRA, dst=canvas[y1:y2, x1:x2])
            labels = labels.copy()
            labels[:, :4] *= r
            labels[:, 0:4:2] += bx1 - sx1
            labels[:, 1:4:2] += by1 - sy1
            all_labels.append(labels)
        labels = clip_and_filter(np.concatenate(all_labels), 2 * input_w, 2 * input_h, *self.box_filter)
        img, labels = warp_affine(canvas, labels, matrix, self.img_size, self.box_filter)
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2BGR)
        return img, labels, first_id

    def _mixup(self, origin_img: np.ndarray, origin_labels: np.ndarray, rng: np.random.Generator):
        jitter = rng.uniform(*self.mixup_scale)
        flip = rng.random() > 0.5
        cp_img, cp_labels, _, _ = self._dataset.pull_item(
            int(self._labelled[rng.integers(len(self._labelled))])
        )
        input_h, input_w = self.img_size
        cp_canvas, ratio = letterbox(cp_img, self.img_size)
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
