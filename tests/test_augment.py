"""Augmentations: box_candidates exactly, and draw-and-check that boxes follow the pixels."""

import numpy as np
import pytest

from yolox_fast.data.augment import (
    TrainTransform,
    affine_matrix,
    augment_hsv,
    box_candidates,
    clip_and_filter,
    flip_horizontal,
    letterbox_chw,
    resize_keep_ratio,
    sampled_window,
    warp_affine,
)


def _boxes(*rows):
    return np.array(rows, dtype=np.float64).reshape(-1, 4)


def test_box_candidates_min_size_is_strict():
    before = _boxes([0, 0, 2, 10], [0, 0, 2.01, 10], [0, 0, 10, 2], [0, 0, 10, 2.01])
    assert box_candidates(before, before).tolist() == [False, True, False, True]


def test_box_candidates_area_ratio_is_inclusive():
    before = _boxes([0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10])
    after = _boxes([0, 0, 10, 1.0], [0, 0, 10, 0.99], [0, 0, 10, 10])  # kept 10%, 9.9%, 100%
    assert box_candidates(before, after, min_size=0.5).tolist() == [True, False, True]


def test_box_candidates_aspect_is_strict_in_both_directions():
    boxes = _boxes([0, 0, 60, 3], [0, 0, 59.9, 3], [0, 0, 3, 60], [0, 0, 3, 59.9])
    assert box_candidates(boxes, boxes).tolist() == [False, True, False, True]


def test_box_candidates_drops_nan_inf_and_inverted():
    before = _boxes([0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10])
    after = _boxes([np.nan, 0, 10, 10], [0, 0, np.inf, 10], [10, 0, 0, 10], [1, 1, 9, 9])
    assert box_candidates(before, after).tolist() == [False, False, False, True]


def test_box_candidates_thresholds_are_configurable():
    before = _boxes([0, 0, 10, 10])
    after = _boxes([0, 0, 10, 4])
    assert box_candidates(before, after, min_size=2, min_area_ratio=0.5).tolist() == [False]
    assert box_candidates(before, after, min_size=5, min_area_ratio=0.1).tolist() == [False]
    assert box_candidates(before, after, min_size=3, min_area_ratio=0.4, max_aspect=2.6).tolist() == [True]


def test_clip_and_filter_clips_then_filters():
    labels = np.array([[-5, -5, 20, 20, 1], [95, 10, 120, 30, 2], [99, 0, 200, 50, 3]], dtype=np.float32)
    out = clip_and_filter(labels, 100, 100, 2.0, 0.1, 20.0)
    # box 1 keeps 5x20 of 25x20 (20% >= 10%); box 2 keeps 1 px of width (<= 2): dropped
    assert out.tolist() == [[0, 0, 20, 20, 1], [95, 10, 100, 30, 2]]


def _rect_image(h, w, box, value=255):
    img = np.zeros((h, w, 3), dtype=np.uint8)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = value
    return img


def _pixel_box(img, threshold=128):
    ys, xs = np.nonzero(img[..., 0] > threshold)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float64)


@pytest.mark.parametrize("seed", range(6))
def test_affine_warp_box_lands_on_its_pixels(seed):
    box = (70, 50, 130, 110)
    img = _rect_image(200, 240, box)
    labels = np.array([[*box, 3]], dtype=np.float32)
    rng = np.random.default_rng(seed)
    matrix = affine_matrix(rng, img.shape[:2], (160, 180), 10, 0.1, (0.6, 1.2), 2)
    out, new = warp_affine(img, labels, matrix, (160, 180))
    assert out.shape == (160, 180, 3)
    assert len(new) == 1 and new[0, 4] == 3
    # the label box is the hull of the warped corners: the drawn pixels fill it to within interpolation
    np.testing.assert_allclose(_pixel_box(out), new[0, :4], atol=2.0)


def test_affine_warp_drops_boxes_pushed_out_of_the_image():
    img = _rect_image(100, 100, (0, 0, 10, 10))
    labels = np.array([[0, 0, 10, 10, 0], [40, 40, 60, 60, 1]], dtype=np.float32)
    # scale 1, no rotation/shear, translated so the source centre lands at the target centre:
    # target 40x40 shows source [30, 70) -> the corner box is gone, the centre one kept
    rng = np.random.default_rng(0)
    _, new = warp_affine(img, labels, affine_matrix(rng, img.shape[:2], (40, 40), 0, 0, (1, 1), 0), (40, 40))
    np.testing.assert_allclose(new, [[10, 10, 30, 30, 1]], atol=1e-4)


def test_flip_moves_box_with_pixels():
    box = (10, 20, 40, 35)
    img = _rect_image(50, 100, box)
    out, boxes = flip_horizontal(img, np.array([box], dtype=np.float32))
    np.testing.assert_array_equal(_pixel_box(out), boxes[0])


def test_letterbox_scales_boxes_with_pixels():
    box = (40, 20, 120, 60)
    img = _rect_image(80, 160, box)
    out, r = letterbox_chw(img, (64, 64))
    assert out.shape == (3, 64, 64) and r == pytest.approx(0.4)
    assert (out[:, 32:, :] == 114).all()  # 160x80 -> 64x32 at the top-left, padding below
    np.testing.assert_allclose(_pixel_box(out.transpose(1, 2, 0)), np.array(box) * r, atol=1.0)
    resized, r2 = resize_keep_ratio(img, (64, 64))
    assert resized.shape == (32, 64, 3) and r2 == r


def test_train_transform_outputs_cxcywh_and_drops_boxes_of_a_pixel():
    img = _rect_image(100, 100, (10, 10, 50, 30))
    labels = np.array([[10, 10, 50, 30, 2], [60, 60, 64, 64, 1], [70, 70, 71, 90, 0]], dtype=np.float32)
    tt = TrainTransform(max_labels=10, flip_prob=0.0, hsv_prob=0.0)
    out, targets = tt(img, labels, (50, 50), np.random.default_rng(0))
    # uint8 (the training process converts to float on its device), the eval letterbox's pixel values
    assert out.shape == (3, 50, 50) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, letterbox_chw(img, (50, 50))[0])
    # r = 0.5: box 1 -> (5, 5, 25, 15); box 2 -> 2x2 px, kept (> 1 px, as official YOLOX);
    # box 3 -> 0.5 px wide: dropped
    np.testing.assert_allclose(targets, [[2, 15, 10, 20, 10], [1, 31, 31, 2, 2]])
    yolov5_filter = TrainTransform(max_labels=10, flip_prob=0.0, hsv_prob=0.0, box_filter=(2.0, 0.1, 20.0))
    _, targets = yolov5_filter(img, labels, (50, 50), np.random.default_rng(0))
    np.testing.assert_allclose(targets, [[2, 15, 10, 20, 10]])  # not > 2 px: dropped


@pytest.mark.parametrize("shape", [(100, 100), (60, 100), (100, 60), (50, 50)])
def test_train_transform_flip_equals_mirroring_before_the_letterbox(shape):
    """YOLOX's order (mirror the image, then letterbox) gives the same pixels and boxes, padding right and
    bottom; an image of the input size is mirrored as it is copied out, with the same result."""
    box = (10, 12, 41, 30)
    img = _rect_image(*shape, box)
    labels = np.array([[*box, 1]], dtype=np.float32)
    out, targets = TrainTransform(flip_prob=1.0, hsv_prob=0.0)(
        img.copy(), labels, (50, 50), np.random.default_rng(0)
    )
    mirrored, mirrored_box = flip_horizontal(img, labels[:, :4])
    expected, r = letterbox_chw(mirrored, (50, 50))
    np.testing.assert_array_equal(out, expected)
    cx, cy, w, h = targets[0, 1:]
    np.testing.assert_allclose(
        [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], mirrored_box[0] * r, atol=1.0
    )


def test_train_transform_truncation_is_logged_once(log_lines):
    TrainTransform._warned_truncation = False
    img = np.zeros((64, 64, 3), np.uint8)
    labels = np.array([[i, i, i + 20, i + 20, 0] for i in range(30)], dtype=np.float32)
    tt = TrainTransform(max_labels=8, flip_prob=0.0, hsv_prob=1.0)
    for seed in range(3):
        _, targets = tt(img.copy(), labels, (64, 64), np.random.default_rng(seed))
        assert len(targets) == 8
    assert sum("max_labels=8" in line for line in log_lines) == 1


def test_augment_hsv_matches_plain_arithmetic():
    import cv2

    img = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    for seed in range(40):  # every branch: hue shifted, only saturation/value, nothing
        out = img.copy()
        augment_hsv(out, np.random.default_rng(seed))
        rng = np.random.default_rng(seed)  # the same draws, applied the obvious way
        gains = (rng.uniform(-1, 1, 3) * [5, 30, 30] * rng.integers(0, 2, 3)).astype(np.int16)
        if not gains.any():  # no shift: no lossy round trip through HSV either
            np.testing.assert_array_equal(out, img)
            continue
        hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV).astype(np.int16)
        hsv[..., 0] = (hsv[..., 0] + gains[0]) % 180
        hsv[..., 1:] = np.clip(hsv[..., 1:] + gains[1:], 0, 255)
        np.testing.assert_array_equal(out, cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2BGR))


def test_area_test_compares_with_the_reference_box_when_given():
    """After a rotation the axis-aligned hull is larger than the scaled original box; the 10% area
    rule is about the original, so a reference box decides."""
    from yolox_fast.data.augment import clip_and_filter

    labels = np.array([[-95.0, 0.0, 5.0, 60.0, 1.0]])  # hull 100 x 60, 5 x 60 left after clipping
    assert len(clip_and_filter(labels, 100, 100, 2.0, 0.1, 20.0)) == 0  # 5% of the hull
    reference = np.array([[0.0, 0.0, 40.0, 40.0]])  # the original box at the warp's scale
    kept = clip_and_filter(labels, 100, 100, 2.0, 0.1, 20.0, reference=reference)
    np.testing.assert_allclose(kept, [[0.0, 0.0, 5.0, 60.0, 1.0]])  # 300 px^2 >= 10% of 1600


@pytest.mark.parametrize("channels", [3, 4])
def test_the_warp_reads_nothing_outside_the_sampled_window(channels):
    """Pixels outside `sampled_window` may hold anything: the warp's output does not change. Matrices
    span shrinking, enlarging, any rotation, shear and moves that leave the canvas partly or wholly."""
    rng = np.random.default_rng(0)
    src_size, target = (160, 200), (72, 88)
    clean = rng.integers(0, 256, (*src_size, channels), dtype=np.uint8)
    empty_windows = 0
    for trial in range(300):
        matrix = affine_matrix(rng, src_size, target, 180, 0.9, (0.1, 3.0), 20)
        if trial % 5 == 0:
            matrix[:, 2] += rng.uniform(-300, 300, 2)  # far off: a window at the border, or none
        x1, y1, x2, y2 = sampled_window(matrix, src_size, target)
        assert 0 <= x1 <= x2 <= src_size[1] and 0 <= y1 <= y2 <= src_size[0]
        noisy = rng.integers(0, 256, clean.shape, dtype=np.uint8)
        noisy[y1:y2, x1:x2] = clean[y1:y2, x1:x2]
        labels = np.zeros((0, 5), np.float32)
        want, _ = warp_affine(clean, labels, matrix, target)
        got, _ = warp_affine(noisy, labels, matrix, target)
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}: window {(x1, y1, x2, y2)}")
        empty_windows += x1 == x2 or y1 == y2
    assert 0 < empty_windows < 60  # both kinds were tried


def test_a_degenerate_matrix_samples_the_whole_image():
    for matrix in (np.zeros((2, 3)), np.array([[np.nan, 0, 0], [0, 1, 0]]), np.array([[1, 2, 0], [1, 2, 0]])):
        assert sampled_window(matrix, (50, 60), (20, 20)) == (0, 0, 60, 50)


def test_a_four_channel_warp_equals_the_three_channel_one():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (120, 140, 3), dtype=np.uint8)
    bgrx = np.concatenate([img, rng.integers(0, 256, (120, 140, 1), dtype=np.uint8)], axis=2)
    labels = np.array([[10, 20, 60, 90, 1]], np.float32)
    for _ in range(20):
        matrix = affine_matrix(rng, (120, 140), (64, 64), 30, 0.2, (0.3, 1.5), 5)
        three, boxes3 = warp_affine(img, labels, matrix, (64, 64))
        four, boxes4 = warp_affine(bgrx, labels, matrix, (64, 64))
        np.testing.assert_array_equal(four[..., :3], three)
        np.testing.assert_array_equal(boxes4, boxes3)
