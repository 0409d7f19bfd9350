"""MosaicDetection: boxes follow pixels through mosaic + affine, never degenerate, deterministic."""

from types import SimpleNamespace

import numpy as np
import pytest

from yolox_fast.data.augment import TrainTransform
from yolox_fast.data.config import load_dataset_config
from yolox_fast.data.datasets.coco import COCODataset
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
        self.records = [SimpleNamespace(boxes=np.array([b])) for b in self.items]
        self.class_names = tuple(str(i) for i in range(n))

    def __len__(self):
        return len(self.items)

    def pull_item(self, i):
        img = np.zeros((*self.size, 3), np.uint8)
        x1, y1, x2, y2 = self.items[i]
        img[y1:y2, x1:x2] = COLOURS[i]
        return img, np.array([[*self.items[i], i]], np.float32), self.size, i


def _to_hwc(img):
    return np.ascontiguousarray(img.transpose(1, 2, 0)).astype(np.int32)


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_mosaic_boxes_land_on_their_pixels(seed, rotate):
    ds = Rects()
    mosaic = MosaicDetection(
        ds,
        (128, 128),
        preproc=TrainTransform(flip_prob=0.5, hsv_prob=0.0),
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
    cfg = load_dataset_config(tiny_shapes_coco["config"])
    ds = COCODataset(cfg["root"], "train2017", "instances_train2017.json", img_size=(96, 96))
    return MosaicDetection(ds, (96, 96), mosaic_scale=(0.1, 2.0), degrees=10, shear=2, mixup_scale=(0.5, 1.5))


def test_no_output_box_is_tiny_nan_or_outside(shapes_mosaic):
    total = 0
    for seed in range(40):
        _, targets, _, _ = shapes_mosaic[(seed % 2 == 0, seed % len(shapes_mosaic), (3, seed))]
        assert np.isfinite(targets).all()
        assert (targets[:, 3] > 2).all() and (targets[:, 4] > 2).all()
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
    cfg = load_dataset_config(tiny_shapes_coco["config"])
    ds = COCODataset(cfg["root"], "train2017", "instances_train2017.json", img_size=(96, 96))
    kwargs = {
        "mosaic_scale": (1, 1),
        "degrees": 0,
        "shear": 0,
        "translate": 0,
        "mixup_scale": (1, 1),
        "preproc": TrainTransform(flip_prob=0, hsv_prob=0),
    }
    plain = MosaicDetection(ds, (96, 96), enable_mixup=False, **kwargs)
    mixed = MosaicDetection(ds, (96, 96), enable_mixup=True, mixup_prob=1.0, **kwargs)
    more = sum(len(mixed[(True, i, (0, i))][1]) > len(plain[(True, i, (0, i))][1]) for i in range(8))
    assert more >= 4
