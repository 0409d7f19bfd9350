"""VOC mAP: the devkit's matching rules on a case small enough to work out by hand."""

import numpy as np
import pytest

from yolox_fast.evaluators.voc import voc_ap, voc_class_ap, voc_map

# One class, two images. Image "a": a normal box and a difficult one; image "b": one normal box.
GT = {
    "a": (np.array([[0, 0, 10, 10], [20, 20, 30, 30]], float), np.array([False, True])),
    "b": (np.array([[0, 0, 10, 10]], float), np.array([False])),
}
# By descending score: TP, duplicate (FP), hit on the difficult box (ignored), miss (FP), then a box
# with IoU 0.8 with b's box (TP at IoU 0.5, FP at IoU 0.85).
DETS = [
    ("a", 0.9, [0, 0, 10, 10]),
    ("a", 0.8, [0, 0, 10, 10]),
    ("a", 0.7, [20, 20, 30, 30]),
    ("b", 0.6, [50, 50, 60, 60]),
    ("b", 0.5, [0, 0, 10, 8]),
]


def _class_ap(dets, thresholds, use_07):
    ids = [d[0] for d in dets]
    scores = np.array([d[1] for d in dets])
    boxes = np.array([d[2] for d in dets], float)
    return voc_class_ap(ids, scores, boxes, GT, thresholds, use_07)


def test_area_under_curve_matches_hand_computation():
    # IoU 0.5: recall .5 .5 .5 .5 1, precision 1 .5 .5 1/3 .5 -> envelope: 1 up to recall .5, .5 up to 1
    # -> AP = .5 * 1 + .5 * .5 = .75. IoU 0.85: the last box is a FP too -> AP = .5 * 1 = .5
    np.testing.assert_allclose(_class_ap(DETS, (0.5, 0.85), use_07=False), [0.75, 0.5])


def test_eleven_point_matches_hand_computation():
    # IoU 0.5: precision 1 at recall points 0..0.5 (6 points), .5 at 0.6..1.0 (5 points) -> 8.5 / 11
    # IoU 0.85: recall never exceeds .5 -> 6 / 11
    np.testing.assert_allclose(_class_ap(DETS, (0.5, 0.85), use_07=True), [8.5 / 11, 6 / 11])


def test_detection_order_given_does_not_matter():
    shuffled = [DETS[i] for i in (4, 2, 0, 3, 1)]
    np.testing.assert_allclose(_class_ap(shuffled, (0.5,), False), _class_ap(DETS, (0.5,), False))


def test_difficult_only_class_is_undefined_not_zero():
    gt = {"a": (np.array([[0, 0, 10, 10]], float), np.array([True]))}
    ap = voc_class_ap(["a"], np.array([0.9]), np.array([[0, 0, 10, 10]], float), gt, (0.5,))
    assert np.isnan(ap).all()


def test_no_detections_scores_zero():
    ap = voc_class_ap([], np.zeros(0), np.zeros((0, 4)), GT, (0.5,))
    assert ap.tolist() == [0.0]


def test_voc_ap_eleven_point_reaches_exact_recall_points():
    # recall exactly 0.3 must count for the 0.3 point (np.arange(0, 1.1, 0.1) gives 0.30000000000000004)
    assert voc_ap(np.array([0.3]), np.array([1.0]), use_07_metric=True) == pytest.approx(4 / 11)


def test_voc_map_splits_by_class_and_reports_each():
    gt = {
        0: (np.array([[0, 0, 10, 10], [0, 0, 5, 5]], float), np.array([0, 1]), np.array([False, False])),
        1: (np.zeros((0, 4)), np.zeros(0, int), np.zeros(0, bool)),
    }
    dets = {
        0: np.array([[0, 0, 10, 10, 0.9, 0], [0, 0, 5, 5, 0.8, 0]]),  # class 1's box predicted as class 0
        1: np.array([[0, 0, 10, 10, 0.7, 1]]),  # class 1 on an image without class-1 boxes: FP
    }
    aps = voc_map(dets, gt, num_classes=3, iou_thresholds=(0.5,), use_07_metric=False)
    assert aps.shape == (3, 1)
    assert aps[0, 0] == pytest.approx(1.0)  # TP first, then an FP after full recall
    assert aps[1, 0] == pytest.approx(0.0)
    assert np.isnan(aps[2, 0])  # no ground truth at all


# ---------------------------------------------------------------- end to end on a generated set
def _voc_evaluator(tiny_shapes_voc):
    from oracle_model import shapes_exp

    from yolox_fast.evaluators.build import build_evaluator

    exp = shapes_exp(tiny_shapes_voc["config"])
    return exp, build_evaluator(exp, batch_size=3, is_distributed=False)


def test_evaluator_perfect_detector_scores_one(tiny_shapes_voc):
    from oracle_model import oracle_for

    from yolox_fast.evaluators.voc import VOCEvaluator

    exp, evaluator = _voc_evaluator(tiny_shapes_voc)
    assert isinstance(evaluator, VOCEvaluator) and evaluator.use_07_metric  # VOC2007 sets
    model, _ = oracle_for(evaluator.dataloader.dataset, exp.num_classes, exp.test_size, noise=False)
    ap50_95, ap50, summary = evaluator.evaluate(model)
    assert ap50_95 == pytest.approx(1.0) and ap50 == pytest.approx(1.0)
    assert evaluator.last_result["num_images"] == tiny_shapes_voc["num_val"]
    assert "circle" in summary


def test_evaluator_equals_voc_map_of_the_detections_it_was_fed(tiny_shapes_voc):
    from oracle_model import oracle_for

    exp, evaluator = _voc_evaluator(tiny_shapes_voc)
    dataset = evaluator.dataloader.dataset
    model, expected = oracle_for(dataset, exp.num_classes, exp.test_size, noise=True)
    ap50_95, ap50, _ = evaluator.evaluate(model)
    gt = {r.img_id: (r.boxes, r.classes, r.difficult) for r in dataset.records}
    aps = voc_map(expected, gt, exp.num_classes, use_07_metric=True)
    present = ~np.isnan(aps[:, 0])
    assert 0.1 < ap50_95 < 0.99
    assert ap50 == pytest.approx(np.mean(aps[present, 0]), abs=1e-6)
    assert ap50_95 == pytest.approx(np.mean(aps[present]), abs=1e-6)
