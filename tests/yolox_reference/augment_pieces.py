"""(e, deterministic part) Each augmentation step of official YOLOX 0.3.0 against yolox_fast's, given the
same random draws: HSV, mirror, letterbox, mosaic tile placement, the affine warp of boxes, the affine
matrix itself, and TrainTransform as a whole.

Random draws are fed to yolox_fast through a stand-in generator that returns given values; official's
draws come from Python's / NumPy's global generators, seeded and replayed.

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/augment_pieces.py
"""

from __future__ import annotations

import random

import common
import numpy as np


class FixedDraws:
    """A stand-in for np.random.Generator that hands out the given values, in order, per method."""

    def __init__(self, **values) -> None:
        self.values = {k: list(v) for k, v in values.items()}

    def _next(self, name: str, size=None):
        if size is None:
            return self.values[name].pop(0)
        return np.array([self.values[name].pop(0) for _ in range(int(np.prod(size)))]).reshape(size)

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._next("uniform", size)

    def integers(self, low, high=None, size=None):
        return self._next("integers", size)

    def random(self):
        return self._next("random")


class UnitDraws:
    """A stand-in for np.random.Generator whose `uniform(low, high)` maps the given unit variates as Python's
    random.uniform does (low + (high - low) * u): fed official's random.random() values, it also checks the
    ranges each side draws from."""

    def __init__(self, units: list[float]) -> None:
        self.units = list(units)

    def uniform(self, low=0.0, high=1.0, size=None):
        assert size is None
        return low + (high - low) * self.units.pop(0)


def images() -> list[np.ndarray]:
    """Generated shapes images (square and cut to non-square) and one holding every byte value."""
    from yolox_fast.data.datasets.synthetic import render_image

    out = [render_image(np.random.default_rng(i), 256)[0] for i in range(3)]
    out.append(np.ascontiguousarray(out[0][:, :150]))
    out.append(np.arange(256 * 3 * 40, dtype=np.int64).reshape(40, 256, 3).astype(np.uint8) * 7)
    return out


def hsv_equal(imgs) -> dict:
    from yolox.data.data_augment import augment_hsv as official_hsv

    from yolox_fast.data.augment import augment_hsv

    worst = 0
    cases = 0
    for seed in range(12):
        for img in imgs:
            np.random.seed(seed)
            draws = np.random.uniform(-1, 1, 3)
            mask = np.random.randint(0, 2, 3)
            np.random.seed(seed)
            a = img.copy()
            official_hsv(a)
            b = img.copy()
            augment_hsv(b, FixedDraws(uniform=draws.tolist(), integers=mask.tolist()))
            worst = max(worst, int(np.abs(a.astype(int) - b.astype(int)).max()))
            cases += 1
    return {"cases": cases, "max_abs_pixel_diff": worst}


def mirror_equal(imgs) -> dict:
    from yolox.data.data_augment import _mirror

    from yolox_fast.data.augment import flip_horizontal

    boxes = np.array([[0.0, 5.0, 30.0, 40.0], [100.5, 7.25, 149.0, 39.0]])
    worst_img, worst_box = 0, 0.0
    for img in imgs:
        a_img, a_boxes = _mirror(img.copy(), boxes.copy(), prob=1.0)
        b_img, b_boxes = flip_horizontal(img.copy(), boxes.copy())
        worst_img = max(worst_img, int(np.abs(a_img.astype(int) - b_img.astype(int)).max()))
        worst_box = max(worst_box, float(np.abs(a_boxes - b_boxes).max()))
    return {"max_abs_pixel_diff": worst_img, "max_abs_box_diff": worst_box}


def letterbox_equal(imgs) -> dict:
    from yolox.data.data_augment import preproc as official_preproc

    from yolox_fast.data.augment import letterbox_chw

    worst, worst_r = 0.0, 0.0
    for img in imgs:
        for size in ((256, 256), (320, 320), (224, 320), (416, 416), (128, 96)):
            a, ra = official_preproc(img, size)
            b, rb = letterbox_chw(img, size)
            worst = max(worst, float(np.abs(a - b).max()))
            worst_r = max(worst_r, abs(ra - rb))
    return {"max_abs_pixel_diff": worst, "max_abs_ratio_diff": worst_r}


def placement_equal() -> dict:
    from yolox.data.datasets.mosaicdetection import get_mosaic_coordinate

    from yolox_fast.data.mosaic import mosaic_placement

    rng = np.random.default_rng(0)
    mismatches = 0
    cases = 0
    for _ in range(500):
        input_h, input_w = int(rng.integers(64, 640)), int(rng.integers(64, 640))
        yc = int(rng.uniform(0.5 * input_h, 1.5 * input_h))
        xc = int(rng.uniform(0.5 * input_w, 1.5 * input_w))
        h, w = int(rng.integers(1, input_h + 1)), int(rng.integers(1, input_w + 1))
        for k in range(4):
            a = get_mosaic_coordinate(None, k, xc, yc, w, h, input_h, input_w)
            b = mosaic_placement(k, xc, yc, w, h, input_h, input_w)
            mismatches += tuple(a[0]) != tuple(b[0]) or tuple(a[1]) != tuple(b[1])
            cases += 1
    return {"cases": cases, "mismatches": mismatches}


def affine_boxes_equal() -> dict:
    """Warp + hull + clip of boxes by the same matrix (official's apply_affine_to_bboxes vs ours)."""
    from yolox.data.data_augment import apply_affine_to_bboxes, get_affine_matrix

    from yolox_fast.data.augment import warp_boxes

    worst = 0.0
    for seed in range(50):
        random.seed(seed)
        matrix, scale = get_affine_matrix(
            (320, 256), degrees=10.0, translate=0.1, scales=(0.5, 1.5), shear=2.0
        )
        rng = np.random.default_rng(seed)
        xy = rng.uniform(-50, 600, (20, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(1, 200, (20, 2))], 1)
        labels = np.concatenate([boxes, np.zeros((20, 1))], 1)
        a = apply_affine_to_bboxes(labels.copy(), (320, 256), matrix, scale)[:, :4]
        b = warp_boxes(boxes, matrix)
        b[:, [0, 2]] = b[:, [0, 2]].clip(0, 320)
        b[:, [1, 3]] = b[:, [1, 3]].clip(0, 256)
        worst = max(worst, float(np.abs(a - b).max()))
    return {"max_abs_box_diff": worst}


def affine_matrix_relation() -> dict:
    """Official's and ours' matrices from the same draws: the same linear part (rotation, scale, shear);
    the translations differ by exactly out_size / 2 - L @ src_centre (ours pivots about the source
    centre and lands it on the output centre; official pivots about the origin)."""
    from yolox.data.data_augment import get_affine_matrix

    from yolox_fast.data.augment import affine_matrix

    worst_linear, worst_shift = 0.0, 0.0
    out_hw, src_hw = (256, 320), (512, 640)  # a mosaic canvas is twice the output
    for seed in range(50):
        # official's draws, replayed: angle, scale, shear_x, shear_y, translate x, translate y
        random.seed(seed)
        angle, scale = random.uniform(-10.0, 10.0), random.uniform(0.5, 1.5)
        shear_x, shear_y = random.uniform(-2.0, 2.0), random.uniform(-2.0, 2.0)
        tx, ty = random.uniform(-0.1, 0.1), random.uniform(-0.1, 0.1)
        random.seed(seed)
        official, _ = get_affine_matrix((out_hw[1], out_hw[0]), 10.0, 0.1, (0.5, 1.5), 2.0)
        # ours draws: angle, scale, shear of row 0 (official's shear_y), of row 1, centre x, centre y
        ours = affine_matrix(
            FixedDraws(uniform=[angle, scale, shear_y, shear_x, 0.5 + tx, 0.5 + ty]),
            src_hw,
            out_hw,
            10,
            0.1,
            (0.5, 1.5),
            2,
        )
        linear = official[:, :2]
        worst_linear = max(worst_linear, float(np.abs(ours[:, :2] - linear).max()))
        expected_shift = np.array([out_hw[1] / 2, out_hw[0] / 2]) - linear @ np.array(
            [src_hw[1] / 2, src_hw[0] / 2]
        )
        worst_shift = max(worst_shift, float(np.abs((ours[:, 2] - official[:, 2]) - expected_shift).max()))
    return {"max_abs_linear_diff": worst_linear, "max_abs_shift_minus_expected": worst_shift}


def affine_origin_vs_random_affine() -> dict:
    """`affine_pivot "origin"` against official's random_affine (the mosaic's last step) on the same 2x
    canvas, boxes and draws: the matrix, the warped image and the warped boxes. Official filters no box here
    (its TrainTransform later drops those of min side <= 1 px); ours applies that filter (its default,
    box_min_size 1) right after the warp: its boxes are official's with min side > 1 px."""
    from yolox.data.data_augment import get_affine_matrix, random_affine

    from yolox_fast.data.augment import affine_matrix, warp_affine

    out_hw = (256, 320)
    canvas = np.full((512, 640, 3), 114, np.uint8)
    for k, tile in enumerate(images()[:3]):  # three generated images on the 2x canvas
        canvas[(k // 2) * 256 : (k // 2) * 256 + 256, (k % 2) * 320 : (k % 2) * 320 + 256] = tile
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 600, (30, 2))
    labels = np.concatenate([xy, xy + rng.uniform(1, 150, (30, 2)), rng.integers(0, 4, (30, 1))], 1)
    labels[:, [0, 2]] = labels[:, [0, 2]].clip(0, 640)
    labels[:, [1, 3]] = labels[:, [1, 3]].clip(0, 512)
    worst_matrix, worst_pixel, worst_box, kept_mismatches, kept = 0.0, 0, 0.0, 0, 0
    for seed in range(30):
        # official's unit variates, in its order: angle, scale, shear_x, shear_y, translation x, y
        random.seed(seed)
        angle, scale, shear_x, shear_y, tx, ty = (random.random() for _ in range(6))
        random.seed(seed)
        official_img, official_labels = random_affine(
            canvas.copy(), labels.copy(), (out_hw[1], out_hw[0]), 10.0, 0.1, (0.5, 1.5), 2.0
        )
        random.seed(seed)
        official_matrix, _ = get_affine_matrix((out_hw[1], out_hw[0]), 10.0, 0.1, (0.5, 1.5), 2.0)
        # ours draws: angle, scale, shear of row 0 (official's shear_y), of row 1, then the translation
        draws = UnitDraws([angle, scale, shear_y, shear_x, tx, ty])
        matrix = affine_matrix(draws, canvas.shape[:2], out_hw, 10, 0.1, (0.5, 1.5), 2, pivot="origin")
        ours_img, ours_labels = warp_affine(canvas.copy(), labels.copy(), matrix, out_hw)
        worst_matrix = max(worst_matrix, float(np.abs(matrix - official_matrix).max()))
        worst_pixel = max(worst_pixel, int(np.abs(ours_img.astype(int) - official_img.astype(int)).max()))
        sides = official_labels[:, 2:4] - official_labels[:, 0:2]
        expected = official_labels[sides.min(1) > 1]
        kept += len(expected)
        if len(expected) != len(ours_labels) or not np.array_equal(expected[:, 4], ours_labels[:, 4]):
            kept_mismatches += 1
            continue
        if len(expected):
            worst_box = max(worst_box, float(np.abs(expected[:, :4] - ours_labels[:, :4]).max()))
    return {
        "cases": 30,
        "boxes_kept": kept,
        "max_abs_matrix_diff": worst_matrix,
        "max_abs_pixel_diff": worst_pixel,
        "kept_box_mismatches": kept_mismatches,
        "max_abs_box_diff": worst_box,
    }


def train_transform_compare(imgs) -> dict:
    """Both TrainTransforms, no HSV, always mirrored, on non-mosaic-like inputs: same image and the same
    boxes, except the boxes 1 < min side <= 2 px (official keeps, ours' box_candidates drops)."""
    from yolox.data.data_augment import TrainTransform as OfficialTT

    from yolox_fast.data.augment import TrainTransform

    img = imgs[3]  # 256 x 150: letterboxed into 320 x 320 it is scaled by 1.25
    labels = np.array(
        [
            [10, 10, 60, 70, 0],
            [100, 200, 149, 255, 1],
            [20, 100, 21.4, 130, 2],  # 1.4 px wide -> 1.75 px after letterbox
            [30, 30, 30.6, 90, 3],  # 0.6 px -> 0.75 px
        ],
        dtype=np.float64,
    )
    a_img, a_labels = OfficialTT(max_labels=120, flip_prob=1.0, hsv_prob=0.0)(
        img.copy(), labels.copy(), (320, 320)
    )
    b_img, b_labels = TrainTransform(max_labels=120, flip_prob=1.0, hsv_prob=0.0)(
        img.copy(), labels.copy(), (320, 320), np.random.default_rng(0)
    )
    a_labels = a_labels[a_labels.sum(1) > 0]
    common_rows = min(len(a_labels), len(b_labels))
    return {
        "max_abs_pixel_diff": float(np.abs(a_img - b_img).max()),
        "official_boxes_kept": len(a_labels),
        "ours_boxes_kept": len(b_labels),
        "max_abs_label_diff_common": float(np.abs(a_labels[:common_rows] - b_labels[:common_rows]).max()),
        "official_min_sides": np.minimum(a_labels[:, 3], a_labels[:, 4]).round(3).tolist(),
        "ours_min_sides": np.minimum(b_labels[:, 3], b_labels[:, 4]).round(3).tolist(),
    }


def collect(argv: list[str] | None = None) -> dict:
    imgs = images()
    return {
        "hsv": hsv_equal(imgs),
        "mirror": mirror_equal(imgs),
        "letterbox": letterbox_equal(imgs),
        "mosaic_placement": placement_equal(),
        "affine_boxes": affine_boxes_equal(),
        "affine_matrix": affine_matrix_relation(),
        "affine_origin": affine_origin_vs_random_affine(),
        "train_transform": train_transform_compare(imgs),
    }


if __name__ == "__main__":
    common.run(collect)
