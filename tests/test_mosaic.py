"""MosaicDetection: boxes follow pixels through mosaic + affine, never degenerate, deterministic."""

from pathlib import Path

import numpy as np
import pytest

from yolox_fast.data.augment import (
    TrainTransform,
    affine_matrix,
    clip_and_filter,
    resize_keep_ratio,
    warp_affine,
)
from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.description import read_description
from yolox_fast.data.mosaic import MosaicDetection, mosaic_placement

# distinct, saturated colours (no greys: the canvas padding is 114 grey)
COLOURS = [
    (b, g, r) for b in (0, 128, 255) for g in (0, 128, 255) for r in (0, 128, 255) if len({b, g, r}) > 1
]


class Rects:
    """Dataset stub: image i is black with one rectangle of colour i; its class is i."""

    def __init__(self, n=24, size=(96, 128)):
        rng = np.random.default_rng(1)
        self.items = []
        for _i in range(n):
            h, w = size
            x1, y1 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
            box = (x1, y1, x1 + int(rng.integers(12, 40)), y1 + int(rng.integers(12, 40)))
            self.items.append(box)
        self.size = size
        self.class_names = tuple(str(i) for i in range(n))

    def __len__(self):
        return len(self.items)

    def resized_size(self, i):
        return self.size

    def box_counts(self):
        return np.ones(len(self.items), dtype=np.int64)

    def pull_item(self, i, with_image=True):
        img = np.zeros((*self.size, 3), np.uint8)
        x1, y1, x2, y2 = self.items[i]
        img[y1:y2, x1:x2] = COLOURS[i]
        return img if with_image else None, np.array([[*self.items[i], i]], np.float32), self.size, i


def _to_hwc(img):
    return np.ascontiguousarray(img.transpose(1, 2, 0)).astype(np.int32)


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_mosaic_boxes_land_on_their_pixels(seed, rotate):
    ds = Rects()
    mosaic = MosaicDetection(
        ds,
        (128, 128),
        transform=TrainTransform(flip_prob=0.5, hsv_prob=0.0),
        degrees=10 * rotate,
        translate=0.1,
        mosaic_scale=(0.5, 0.7),
        shear=2 * rotate,
        enable_mixup=False,
    )
    img, targets, info, _ = mosaic[(True, seed % len(ds), (0, seed))]
    assert img.shape == (3, 128, 128) and info == (128, 128)
    pixels = _to_hwc(img)
    classes = targets[:, 0].astype(int).tolist()
    checked = 0
    for cls, cx, cy, w, h in targets:
        if classes.count(int(cls)) > 1:
            continue  # the same image drawn twice in this mosaic: colours are ambiguous
        box = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
        if rotate and (box.min() <= 0 or box.max() >= 128):
            continue  # a rotated box cut by the border is the clipped hull, wider than what stays visible
        colour = np.array(COLOURS[int(cls)])
        ys, xs = np.nonzero(np.abs(pixels - colour).sum(-1) < 40)
        drawn = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        np.testing.assert_allclose(drawn, box, atol=2.0)
        checked += 1
    assert checked >= 1


def test_mosaic_placement_tiles_touch_the_centre():
    for k, corner in enumerate([(50, 40), (50, 40), (50, 40), (50, 40)]):
        (bx1, by1, bx2, by2), (sx1, sy1, sx2, sy2) = mosaic_placement(
            k, *corner, w=64, h=64, input_h=64, input_w=64
        )
        assert (bx2 - bx1, by2 - by1) == (sx2 - sx1, sy2 - sy1)  # canvas window == tile window
        assert (bx2 if k in (0, 2) else bx1) == 50 and (by2 if k in (0, 1) else by1) == 40


@pytest.fixture(scope="module")
def shapes_mosaic(tiny_shapes_coco):
    cfg = read_description(tiny_shapes_coco["config"])
    ds = COCODataset(cfg["root"], "train2017", "instances_train2017.json", img_size=(96, 96))
    return MosaicDetection(ds, (96, 96), mosaic_scale=(0.1, 2.0), degrees=10, shear=2, mixup_scale=(0.5, 1.5))


def test_no_output_box_is_tiny_nan_or_outside(shapes_mosaic):
    total = 0
    for seed in range(40):
        _, targets, _, _ = shapes_mosaic[(seed % 2 == 0, seed % len(shapes_mosaic), (3, seed))]
        assert np.isfinite(targets).all()
        assert (targets[:, 3] > 1).all() and (targets[:, 4] > 1).all()  # box_min_size 1 by default
        x1, y1 = targets[:, 1] - targets[:, 3] / 2, targets[:, 2] - targets[:, 4] / 2
        x2, y2 = targets[:, 1] + targets[:, 3] / 2, targets[:, 2] + targets[:, 4] / 2
        assert (
            (x1 >= -1e-3).all()
            and (y1 >= -1e-3).all()
            and (x2 <= 96 + 1e-3).all()
            and (y2 <= 96 + 1e-3).all()
        )
        total += len(targets)
    assert total > 40  # the check ran over real boxes


def test_same_item_same_sample_and_mosaic_flag_respected(shapes_mosaic):
    a = shapes_mosaic[(True, 5, (1, 2, 3))]
    b = shapes_mosaic[(True, 5, (1, 2, 3))]
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    c = shapes_mosaic[(False, 5, (1, 2, 3))]
    assert c[2] == (128, 128) and c[3] == shapes_mosaic.dataset.records[5].img_id  # original size: no mosaic
    assert a[2] == (96, 96)


def test_mixup_adds_boxes_of_a_second_image(tiny_shapes_coco):
    cfg = read_description(tiny_shapes_coco["config"])
    ds = COCODataset(cfg["root"], "train2017", "instances_train2017.json", img_size=(96, 96))
    kwargs = {
        "mosaic_scale": (1, 1),
        "degrees": 0,
        "shear": 0,
        "translate": 0,
        "mixup_scale": (1, 1),
        "transform": TrainTransform(flip_prob=0, hsv_prob=0),
    }
    plain = MosaicDetection(ds, (96, 96), enable_mixup=False, **kwargs)
    mixed = MosaicDetection(ds, (96, 96), enable_mixup=True, mixup_prob=1.0, **kwargs)
    more = sum(len(mixed[(True, i, (0, i))][1]) > len(plain[(True, i, (0, i))][1]) for i in range(8))
    assert more >= 4


def full_canvas_mosaic(pipeline, index, rng):
    """The mosaic as YOLOX builds it, for comparison: every tile decoded and pasted on a full 2x canvas
    of 3 channels, which is then warped whole."""
    ds, (input_h, input_w) = pipeline.dataset, pipeline.img_size
    yc = int(rng.uniform(0.5 * input_h, 1.5 * input_h))
    xc = int(rng.uniform(0.5 * input_w, 1.5 * input_w))
    indices = [index] + rng.integers(0, len(ds), 3).tolist()
    canvas = np.full((2 * input_h, 2 * input_w, 3), 114, np.uint8)
    all_labels = []
    for k, idx in enumerate(indices):
        img, labels, _, _ = ds.pull_item(idx)
        img, r = resize_keep_ratio(img, pipeline.img_size)
        labels = labels.copy()
        labels[:, :4] *= r
        (bx1, by1, bx2, by2), (sx1, sy1, sx2, sy2) = mosaic_placement(
            k, xc, yc, img.shape[1], img.shape[0], input_h, input_w
        )
        canvas[by1:by2, bx1:bx2] = img[sy1:sy2, sx1:sx2]
        labels[:, [0, 2]] += bx1 - sx1
        labels[:, [1, 3]] += by1 - sy1
        all_labels.append(labels)
    labels = clip_and_filter(np.concatenate(all_labels), 2 * input_w, 2 * input_h, *pipeline.box_filter)
    matrix = affine_matrix(
        rng, canvas.shape[:2], pipeline.img_size, pipeline.degrees, pipeline.translate,
        pipeline.mosaic_scale, pipeline.shear,
    )  # fmt: skip
    return warp_affine(canvas, labels, matrix, pipeline.img_size, pipeline.box_filter)


@pytest.mark.parametrize("img_size", [(96, 96), (80, 112)])
def test_the_windowed_mosaic_equals_the_full_canvas_one(tiny_shapes_coco, img_size):
    """Painting only the window the warp reads, skipping tiles outside it and warping 4 channels
    change nothing: the samples equal, pixel for pixel and box for box, those of the full canvas."""
    cfg = read_description(tiny_shapes_coco["config"])
    ds = COCODataset(cfg["root"], "train2017", "instances_train2017.json", img_size=img_size)
    pipeline = MosaicDetection(ds, img_size, mosaic_scale=(0.1, 2.0), degrees=30, shear=5, enable_mixup=False)
    pulls = []
    original = ds.pull_item
    ds.pull_item = lambda index, with_image=True: pulls.append(with_image) or original(index, with_image)
    for seed in range(60):
        words = (7, seed)
        img, targets, _, _ = pipeline[(True, seed % len(ds), words)]
        rng = np.random.default_rng(words)
        rng.random()  # the mosaic_prob draw
        want_img, want_labels = full_canvas_mosaic(pipeline, seed % len(ds), rng)
        want, want_targets = pipeline.transform(want_img, want_labels, img_size, rng)
        np.testing.assert_array_equal(img, want, err_msg=f"seed {seed}")
        np.testing.assert_array_equal(targets, want_targets, err_msg=f"seed {seed}")
    # 4 tiles a sample on each side; some of the mosaic's were never decoded
    assert len(pulls) == 8 * 60 and 0 < pulls.count(False) < 120


def test_a_tile_not_decoded_still_gives_its_labels(tiny_shapes_coco):
    cfg = read_description(tiny_shapes_coco["config"])
    ds = COCODataset(cfg["root"], "train2017", "instances_train2017.json", img_size=(80, 112))
    for i in range(len(ds)):
        img, labels, info, img_id = ds.pull_item(i)
        none, same_labels, same_info, same_id = ds.pull_item(i, with_image=False)
        assert none is None and (same_info, same_id) == (info, img_id)
        np.testing.assert_array_equal(same_labels, labels)
        assert ds.resized_size(i) == img.shape[:2]
    missing = Path(ds.records[0].file)
    missing.rename(missing.with_suffix(".gone"))
    try:  # nothing is read: a tile the mosaic skips costs no file access
        assert ds.pull_item(0, with_image=False)[0] is None
        with pytest.raises(FileNotFoundError):
            ds.pull_item(0)
    finally:
        missing.with_suffix(".gone").rename(missing)
