"""Augmentations on uint8 BGR images with boxes [x1, y1, x2, y2, cls] in pixels.

Every geometric transform (mosaic placement, random affine, mixup crop, letterbox) clips the boxes to
the image and passes them through `box_candidates`, so boxes that are degenerate, NaN, mostly cut
away or absurdly thin never reach the model. Randomness comes from an explicit
`np.random.Generator`, so a sample is a pure function of its seed (cached and uncached runs agree).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np
from loguru import logger

PAD_VALUE = 114  # letterbox / mosaic fill, as YOLOX
# (min_size px, min_area_ratio, max_aspect) of box_candidates by default: what official YOLOX 0.3.0 keeps
# (min side > 1 px); the exp's box_* fields set it for training
DEFAULT_BOX_FILTER = (1.0, 0.0, math.inf)
PIVOTS = ("centre", "origin")  # where the mosaic's random affine acts (see affine_matrix)


def fitted_size(hw: tuple[int, int], size: tuple[int, int]) -> tuple[int, int, float]:
    """(h, w, r) of an image of size `hw` (h, w) resized by r = min(H/h, W/w) to fit `size` (H, W)."""
    r = min(size[0] / hw[0], size[1] / hw[1])
    return int(hw[0] * r), int(hw[1] * r), r


def resize_keep_ratio(img: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, float]:
    """Resize `img` (h, w, 3) by r = min(H/h, W/w) for `size` = (H, W); returns (resized, r)."""
    new_h, new_w, r = fitted_size(img.shape[:2], size)
    if (new_h, new_w) == img.shape[:2]:
        return img, r
    return cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR), r


def letterbox(
    img: np.ndarray, input_size: tuple[int, int], out: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """Resize keeping aspect and paste top-left on a PAD_VALUE canvas of `input_size` (H, W): (uint8
    (H, W, 3), r); a box in `img` maps to the canvas by * r. The one letterbox of training, evaluation,
    the demo and MixUp.

    `out`: an (H, W, 3) uint8 array to paint the canvas into (a slot of a batch), returned. Without it,
    an image that already has the input size is returned as it is (no copy).
    """
    resized, r = resize_keep_ratio(img, input_size)
    h, w = resized.shape[:2]
    if out is None:
        if (h, w) == tuple(input_size):
            return resized, r
        out = np.empty((input_size[0], input_size[1], 3), dtype=np.uint8)
    out[:h, :w] = resized
    out[h:, :] = PAD_VALUE
    out[:h, w:] = PAD_VALUE
    return out, r


def letterbox_chw(img: np.ndarray, input_size: tuple[int, int]) -> tuple[np.ndarray, float]:
    """Letterbox (see `letterbox`) as the eval input: (float32 (3, H, W) BGR 0-255, r); a box in the
    original image maps to the input by * r."""
    canvas, r = letterbox(img, input_size)
    return np.ascontiguousarray(canvas.transpose(2, 0, 1), dtype=np.float32), r


def box_candidates(
    before: np.ndarray,
    after: np.ndarray,
    min_size: float = 2.0,
    min_area_ratio: float = 0.1,
    max_aspect: float = 20.0,
) -> np.ndarray:
    """Which transformed boxes to keep: (N,) bool.

    `before` (N, 4) gives each box's reference size: the pre-transform box brought to the output
    scale (for a crop or paste, simply the box before clipping); `after` (N, 4) the boxes after the
    transform and clipping. A box is kept iff its width and height are > `min_size`, its area is
    >= `min_area_ratio` of the reference area, and max(w/h, h/w) < `max_aspect`.
    Any NaN or infinite coordinate drops the box (so does an area too large for the dtype).
    """
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, inf * 0: the boxes dropped as not finite
        w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
        w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
        area1, area2 = w1 * h1, w2 * h2  # finite iff all four coordinates are
        keep = np.isfinite(area1) & np.isfinite(area2) & (w2 > min_size) & (h2 > min_size)
        keep &= area2 >= min_area_ratio * area1
        # max(w/h, h/w) < max_aspect without the divisions: w2, h2 > min_size >= 0 where it matters
        keep &= (w2 < max_aspect * h2) & (h2 < max_aspect * w2)
    return keep


def clip_and_filter(
    labels: np.ndarray,
    width: float,
    height: float,
    min_size: float,
    min_area_ratio: float,
    max_aspect: float,
    reference: np.ndarray | None = None,
) -> np.ndarray:
    """Clip labels (N, 5+) [x1, y1, x2, y2, cls, ...] to the image and drop what box_candidates rejects.

    `reference` (N, 4): the boxes whose area the kept area is compared with; default the unclipped boxes.
    """
    if len(labels) == 0:
        return labels
    bounds = np.array((width, height, width, height), dtype=labels.dtype)
    clipped = np.minimum(np.maximum(labels[:, :4], 0), bounds)  # (N, 4), a new array; NaN stays NaN
    before = labels[:, :4] if reference is None else reference
    keep = box_candidates(before, clipped, min_size, min_area_ratio, max_aspect)
    out = labels[keep]
    out[:, :4] = clipped[keep]
    return out


def affine_matrix(
    rng: np.random.Generator,
    src_size: tuple[int, int],
    target_size: tuple[int, int],
    degrees: float,
    translate: float,
    scales: Sequence[float],
    shear: float,
    pivot: str = "centre",
) -> np.ndarray:
    """A random 2x3 affine map from a `src_size` (H, W) image to a `target_size` (H, W) one.

    `pivot` "centre": the source centre goes to the target centre (moved by up to `translate` of the
    target size), and rotation by U(-degrees, degrees), isotropic scale U(scales) and shear
    U(-shear, shear) degrees act about it. "origin" (official YOLOX 0.3.0's placement): they act about
    the source's top-left corner, which goes to the target's (moved by up to `translate`), so the
    output shows the source's top-left part (all of it once the scale shrinks it to the target size).
    """
    if pivot not in PIVOTS:
        raise ValueError(f"affine pivot must be one of {PIVOTS}, got {pivot!r}")
    centre = np.eye(3)
    if pivot == "centre":
        centre[0, 2], centre[1, 2] = -src_size[1] / 2, -src_size[0] / 2
    rot = np.eye(3)
    angle = rng.uniform(-degrees, degrees)
    scale = rng.uniform(scales[0], scales[1])
    rot[:2] = cv2.getRotationMatrix2D(angle=angle, center=(0, 0), scale=scale)
    shr = np.eye(3)
    shr[0, 1] = math.tan(rng.uniform(-shear, shear) * math.pi / 180)
    shr[1, 0] = math.tan(rng.uniform(-shear, shear) * math.pi / 180)
    move = np.eye(3)
    anchor = 0.5 if pivot == "centre" else 0.0
    move[0, 2] = rng.uniform(anchor - translate, anchor + translate) * target_size[1]
    move[1, 2] = rng.uniform(anchor - translate, anchor + translate) * target_size[0]
    return (move @ shr @ rot @ centre)[:2]


def warp_boxes(boxes: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Axis-aligned hull (N, 4) of boxes (N, 4) x1y1x2y2 after the 2x3 affine `matrix`."""
    corners = boxes[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 2)  # (4N, 2): tl, tr, br, bl
    mapped = corners @ matrix[:, :2].T + matrix[:, 2]
    mapped = mapped.reshape(-1, 4, 2)
    return np.concatenate([mapped.min(1), mapped.max(1)], axis=1)


def sampled_window(
    matrix: np.ndarray, src_size: tuple[int, int], target_size: tuple[int, int]
) -> tuple[int, int, int, int]:
    """The part (x1, y1, x2, y2) of a `src_size` (H, W) image that `cv2.warpAffine` with the 2x3
    `matrix` into `target_size` (H, W) reads: the box around the output pixel grid mapped back,
    widened by 2 px for the bilinear neighbours and cv2's fixed-point rounding, clipped to the
    image (an empty window where nothing of it is read). The whole image for a degenerate matrix."""
    (a, b, c), (d, e, f) = matrix.tolist()
    det = a * e - b * d
    height, width = target_size
    xs, ys = [], []
    for u, v in ((0, 0), (width - 1, 0), (0, height - 1), (width - 1, height - 1)):  # output corners
        xs.append((e * (u - c) - b * (v - f)) / det if det else math.inf)
        ys.append((a * (v - f) - d * (u - c)) / det if det else math.inf)
    if not all(map(math.isfinite, xs + ys)):
        return 0, 0, src_size[1], src_size[0]
    x1 = min(max(math.floor(min(xs)) - 2, 0), src_size[1])
    y1 = min(max(math.floor(min(ys)) - 2, 0), src_size[0])
    x2 = min(max(math.floor(max(xs)) + 3, x1), src_size[1])
    y2 = min(max(math.floor(max(ys)) + 3, y1), src_size[0])
    return x1, y1, x2, y2


def warp_affine(
    img: np.ndarray,
    labels: np.ndarray,
    matrix: np.ndarray,
    target_size: tuple[int, int],
    box_filter: tuple[float, float, float] = DEFAULT_BOX_FILTER,
) -> tuple[np.ndarray, np.ndarray]:
    """Warp `img` (h, w, C), C = 3 or 4, by the 2x3 `matrix` into a `target_size` (H, W) canvas of C
    channels (bilinear, PAD_VALUE outside); labels (N, 5) follow, clipped and filtered (`box_filter`
    = (min_size, min_area_ratio, max_aspect) for box_candidates). Only `sampled_window` of `img` is read.
    """
    size = (target_size[1], target_size[0])
    out = cv2.warpAffine(img, matrix, dsize=size, borderValue=(PAD_VALUE,) * img.shape[2])
    if len(labels):
        # the area test compares with the original box at the warp's scale, not with the (larger)
        # axis-aligned hull of the rotated/sheared box
        reference = labels[:, :4] * np.sqrt(abs(np.linalg.det(matrix[:, :2])))
        labels = labels.copy()
        labels[:, :4] = warp_boxes(labels[:, :4], matrix)
        labels = clip_and_filter(labels, target_size[1], target_size[0], *box_filter, reference=reference)
    return out, labels


def augment_hsv(
    img: np.ndarray, rng: np.random.Generator, hgain: int = 5, sgain: int = 30, vgain: int = 30
) -> None:
    """Shift hue (mod 180), saturation and value (clipped) of a BGR uint8 image in place by random
    integer offsets; each channel is shifted or left alone with probability 1/2, as YOLOX. When no
    channel is shifted, the image is not touched."""
    gains = rng.uniform(-1, 1, 3) * [hgain, sgain, vgain]
    gains *= rng.integers(0, 2, 3)
    gains = gains.astype(np.int16)
    if not gains.any():
        # about one call in six: YOLOX still makes the lossy round trip through HSV; the image is
        # left as it is here instead, saving two colour conversions
        return
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
    if gains[0] == 0:
        # saturation and value only: a saturating add (clip to 0-255) is cheaper than a 3-channel table
        cv2.add(hsv, (0, int(gains[1]), int(gains[2]), 0), dst=hsv)
    else:
        # hue wraps mod 180: lookup tables instead of int16 arithmetic on the whole image, same values
        x = np.arange(256, dtype=np.int16)
        lut = np.empty((256, 1, 3), dtype=np.uint8)  # one table per channel, applied in one pass
        lut[:, 0, 0] = (x + gains[0]) % 180
        lut[:, 0, 1] = np.clip(x + gains[1], 0, 255)
        lut[:, 0, 2] = np.clip(x + gains[2], 0, 255)
        cv2.LUT(hsv, lut, dst=hsv)
    cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=img)


def flip_horizontal(img: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror an image (h, w, 3) and its boxes (N, 4) x1y1x2y2 left-right."""
    width = img.shape[1]
    boxes = boxes.copy()
    boxes[:, [0, 2]] = width - boxes[:, [2, 0]]
    return cv2.flip(img, 1), boxes  # the same pixels as img[:, ::-1], copied in one vectorised pass


class TrainTransform:
    """Last training step: HSV, flip, letterbox to the input size, boxes to [cls, cx, cy, w, h].

    Returns (img uint8 (3, H, W) BGR, labels (K, 5) float32 with K <= max_labels); the collate pads
    labels to (max_labels, 5). Dropping labels beyond max_labels is logged once per process.
    The image stays uint8 (YOLOX converts it to float32 here): a worker writes a quarter of the bytes
    and hands a quarter to the training process, which converts to float on its device. It is a
    (3, H, W) view of (H, W, 3) memory, not a CHW copy: the collate stacks the pixel rows as they
    are, which is the channels-last layout the model trains in.
    """

    _warned_truncation = False

    def __init__(
        self,
        max_labels: int = 120,
        flip_prob: float = 0.5,
        hsv_prob: float = 1.0,
        box_filter: tuple[float, float, float] = DEFAULT_BOX_FILTER,
    ) -> None:
        self.max_labels = max_labels
        self.flip_prob = flip_prob
        self.hsv_prob = hsv_prob
        self.box_filter = box_filter

    def __call__(
        self, img: np.ndarray, labels: np.ndarray, input_size: tuple[int, int], rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        img = np.ascontiguousarray(img)
        labels = np.asarray(labels, dtype=np.float32).reshape(-1, 5)
        if rng.random() < self.hsv_prob:
            augment_hsv(img, rng)
        if rng.random() < self.flip_prob:
            # mirrored before the resize, as YOLOX (cv2.resize does not commute with a mirror exactly);
            # a copy, not a negative-stride view, which torch.as_tensor (default_collate) refuses
            img, boxes = flip_horizontal(img, labels[:, :4])
            labels = np.concatenate([boxes, labels[:, 4:]], axis=1)
        hwc, r = letterbox(img, input_size)  # a mosaic output has the input size already: no copy
        labels = labels.copy()
        labels[:, :4] *= r
        out = hwc.transpose(2, 0, 1)
        labels = clip_and_filter(labels, input_size[1], input_size[0], *self.box_filter)
        if len(labels) > self.max_labels:
            if not TrainTransform._warned_truncation:
                logger.warning(
                    f"an image has {len(labels)} labels after augmentation, more than max_labels="
                    f"{self.max_labels}; the extra ones are dropped (raise exp.max_labels to keep them). "
                    "Logged once."
                )
                TrainTransform._warned_truncation = True
            labels = labels[: self.max_labels]
        targets = np.empty((len(labels), 5), dtype=np.float32)
        targets[:, 0] = labels[:, 4]
        targets[:, 1] = (labels[:, 0] + labels[:, 2]) / 2
        targets[:, 2] = (labels[:, 1] + labels[:, 3]) / 2
        targets[:, 3] = labels[:, 2] - labels[:, 0]
        targets[:, 4] = labels[:, 3] - labels[:, 1]
        return out, targets
