"""COCO evaluation: our scoring equals pycocotools run by hand, perfect boxes score 1, and the
end-to-end evaluator maps letterboxed predictions back to original pixels correctly."""

import contextlib
import copy
import io

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from yolox_fast.evaluators.coco import coco_score, detections_to_coco_json

CLASS_IDS = [3, 7]  # non-contiguous category ids, as in COCO
NAMES = ["circle", "square"]


def _gt() -> COCO:
    anns = [
        # image 1: two objects; image 2: one; image 3: one (it gets no detections at all)
        (1, 3, [10, 10, 40, 30]),
        (1, 7, [60, 50, 30, 30]),
        (2, 7, [5, 5, 50, 60]),
        (3, 3, [20, 30, 40, 40]),
    ]
    dataset = {
        "images": [{"id": i, "width": 128, "height": 96, "file_name": f"{i}.jpg"} for i in (1, 2, 3)],
        "categories": [{"id": c, "name": n} for c, n in zip(CLASS_IDS, NAMES)],
        "annotations": [
            {
                "id": k + 1,
                "image_id": img,
                "category_id": cat,
                "bbox": box,
                "area": box[2] * box[3],
                "iscrowd": 0,
            }
            for k, (img, cat, box) in enumerate(anns)
        ],
    }
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _det(x, y, w, h, score, cls):
    return [x, y, x + w, y + h, score, cls]


HAND_MADE = {
    1: np.array([_det(12, 9, 38, 33, 0.9, 0), _det(58, 52, 30, 27, 0.6, 1), _det(0, 0, 20, 20, 0.8, 1)]),
    2: np.array([_det(8, 2, 45, 60, 0.7, 1), _det(5, 5, 50, 60, 0.3, 0)]),
    3: np.zeros((0, 6)),
}


def _pycocotools_by_hand(coco_gt, records, img_ids):
    with contextlib.redirect_stdout(io.StringIO()):
        dt = coco_gt.loadRes(copy.deepcopy(records))
        ev = COCOeval(coco_gt, dt, "bbox")
        ev.params.imgIds = img_ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats


def test_hand_made_predictions_equal_pycocotools_called_directly():
    gt = _gt()
    records = detections_to_coco_json(HAND_MADE, CLASS_IDS)
    assert {r["category_id"] for r in records} == {3, 7}
    assert records[0]["bbox"] == pytest.approx([12, 9, 38, 33])  # xyxy -> xywh
    expected = _pycocotools_by_hand(gt, records, [1, 2, 3])
    result = coco_score(gt, HAND_MADE, CLASS_IDS, NAMES, scorer="pycocotools")
    assert result["ap50_95"] == expected[0]
    assert result["ap50"] == expected[1]
    fast = coco_score(gt, HAND_MADE, CLASS_IDS, NAMES)  # faster-coco-eval when installed
    assert fast["stats"] == pytest.approx(list(expected), abs=1e-4)
    assert 0.0 < result["ap50_95"] < 1.0
    assert result["num_images"] == 3
    assert set(result["per_class_ap"]) == set(NAMES)


def test_image_without_detections_still_counts():
    gt = _gt()
    with_empty = coco_score(gt, HAND_MADE, CLASS_IDS)
    without = coco_score(gt, {k: v for k, v in HAND_MADE.items() if k != 3}, CLASS_IDS)
    assert without["num_images"] == 2 and with_empty["num_images"] == 3
    # image 3's circle is a miss only when image 3 is scored
    assert with_empty["per_class_ap"]["3"] < without["per_class_ap"]["3"]


def test_perfect_predictions_score_one():
    gt = _gt()
    perfect = {img: np.zeros((0, 6)) for img in (1, 2, 3)}
    for ann in gt.dataset["annotations"]:
        x, y, w, h = ann["bbox"]
        row = np.array([[x, y, x + w, y + h, 1.0, CLASS_IDS.index(ann["category_id"])]])
        perfect[ann["image_id"]] = np.concatenate([perfect[ann["image_id"]], row])
    result = coco_score(gt, perfect, CLASS_IDS, NAMES)
    assert result["ap50_95"] == pytest.approx(1.0)
    assert result["ap50"] == pytest.approx(1.0)


def test_no_detections_at_all_scores_zero_not_crash():
    result = coco_score(_gt(), {img: np.zeros((0, 6)) for img in (1, 2, 3)}, CLASS_IDS)
    assert result["ap50_95"] == 0.0 and result["num_images"] == 3


# ---------------------------------------------------------------- end to end on a generated set
def _coco_evaluator(tiny_shapes_coco, test_size=(64, 96)):
    from oracle_model import shapes_exp

    from yolox_fast.evaluators.build import build_evaluator

    exp = shapes_exp(tiny_shapes_coco["config"], test_size)
    evaluator = build_evaluator(exp, batch_size=3, is_distributed=False)
    return exp, evaluator


def test_evaluator_perfect_detector_scores_one_through_letterbox(tiny_shapes_coco):
    from oracle_model import oracle_for

    from yolox_fast.evaluators.coco import COCOEvaluator

    # 128 px images into a 64x96 input: boxes are mapped back by r = 0.5
    exp, evaluator = _coco_evaluator(tiny_shapes_coco)
    assert isinstance(evaluator, COCOEvaluator)
    model, _ = oracle_for(evaluator.dataloader.dataset, exp.num_classes, exp.test_size, noise=False)
    ap50_95, ap50, summary = evaluator.evaluate(model)
    assert ap50_95 == pytest.approx(1.0) and ap50 == pytest.approx(1.0)
    assert evaluator.last_result["num_images"] == tiny_shapes_coco["num_val"]
    assert "per class AP" in summary and "circle" in summary
    assert "Average forward time" in summary


def test_evaluator_equals_pycocotools_on_the_detections_it_was_fed(tiny_shapes_coco):
    from oracle_model import oracle_for

    exp, evaluator = _coco_evaluator(tiny_shapes_coco)
    dataset = evaluator.dataloader.dataset
    model, expected = oracle_for(dataset, exp.num_classes, exp.test_size, noise=True)
    ap50_95, ap50, _ = evaluator.evaluate(model)
    records = detections_to_coco_json(expected, list(dataset.class_ids))
    stats = _pycocotools_by_hand(dataset.coco, records, sorted(expected))
    assert 0.1 < ap50_95 < 0.99
    assert ap50_95 == pytest.approx(stats[0], abs=1e-6)
    assert ap50 == pytest.approx(stats[1], abs=1e-6)


def test_empty_eval_set_is_an_error():
    from torch.utils.data import DataLoader

    from yolox_fast.evaluators.coco import COCOEvaluator

    evaluator = COCOEvaluator(DataLoader([], batch_size=2), (64, 64), 0.01, 0.65, num_classes=2)
    with pytest.raises(ValueError, match="empty"):
        evaluator.evaluate(torch.nn.Conv2d(3, 3, 1))


# ------------------------------------------------------------------------------------------ at scale
def _slow_top_per_class(dets, k):
    """Each class's rows sorted by score (ties: row order), its first k kept, all in row order."""
    keep = set()
    for c in np.unique(dets[:, 5]):
        rows = [i for i in range(len(dets)) if dets[i, 5] == c]
        rows.sort(key=lambda i: -dets[i, 4])  # a stable sort, as COCOeval's mergesort
        keep.update(rows[:k])
    return dets[sorted(keep)]


def test_top_per_class_keeps_what_cocoeval_keeps_ties_included():
    from yolox_fast.evaluators.detection_evaluator import top_per_class

    rng = np.random.default_rng(0)
    for n, k in ((0, 3), (5, 10), (200, 7), (500, 100)):
        dets = np.zeros((n, 6))
        dets[:, 4] = rng.choice([0.1, 0.2, 0.5, 0.9], size=n)  # many ties
        dets[:, 5] = rng.integers(0, 4, size=n)
        dets[:, 0] = np.arange(n)  # tells the rows apart
        np.testing.assert_array_equal(top_per_class(dets, k), _slow_top_per_class(dets, k))


def _crowded_case(images=12, classes=3, per_image=400, seed=0):
    """A ground truth and, per image, `per_image` detections (hundreds per class, tied scores among them):
    more than COCOeval's 100 per image and class."""
    rng = np.random.default_rng(seed)
    anns, detections = [], {}
    for img in range(1, images + 1):
        for _ in range(int(rng.integers(1, 8))):
            x, y, w, h = (float(v) for v in rng.uniform([0, 0, 4, 4], [90, 60, 40, 40]))
            crowd = int(rng.random() < 0.1)
            anns.append((img, int(rng.integers(classes)), [x, y, w, h], crowd))
        xy = rng.uniform(0, 100, size=(per_image, 2))
        wh = rng.uniform(2, 40, size=(per_image, 2))
        score = np.round(rng.random(per_image), 2)  # ties
        cls = rng.integers(0, classes, size=per_image)
        detections[img] = np.column_stack([xy, xy + wh, score, cls])
    class_ids = [2 * c + 1 for c in range(classes)]
    dataset = {
        "images": [{"id": i, "width": 128, "height": 96} for i in range(1, images + 1)],
        "categories": [{"id": c, "name": f"c{c}"} for c in class_ids],
        "annotations": [
            {
                "id": k + 1,
                "image_id": img,
                "category_id": class_ids[c],
                "bbox": box,
                "area": box[2] * box[3],
                "iscrowd": crowd,
            }
            for k, (img, c, box, crowd) in enumerate(anns)
        ],
    }
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco, detections, class_ids


@pytest.mark.parametrize("scorer", ["pycocotools", "faster-coco-eval"])
def test_capped_grouped_array_scoring_equals_pycocotools_on_every_detection(scorer):
    from yolox_fast.evaluators.detection_evaluator import top_per_class
    from yolox_fast.evaluators.scorer import COCO_MAX_DETS, coco_evaluate, faster_coco_eval_available

    if scorer == "faster-coco-eval" and not faster_coco_eval_available():
        pytest.skip("faster-coco-eval is not installed")
    coco, detections, class_ids = _crowded_case()
    img_ids = sorted(detections)
    expected = _pycocotools_by_hand(coco, detections_to_coco_json(detections, class_ids), img_ids)
    capped = {i: top_per_class(d, COCO_MAX_DETS) for i, d in detections.items()}
    assert sum(map(len, capped.values())) < sum(map(len, detections.values()))  # the cap did drop some
    result = coco_score(coco, capped, class_ids, scorer=scorer)
    np.testing.assert_allclose(result["stats"], expected, rtol=0, atol=1e-12)
    # scored in passes of at most 300 detections (one category each here): the same arrays
    from yolox_fast.evaluators.coco import coco_results_table

    table = coco_results_table(capped, class_ids)
    one, parts = (coco_evaluate(coco, table, img_ids, scorer, max_pass_dets=m) for m in (10**9, 300))
    np.testing.assert_array_equal(one.precision, parts.precision)
    np.testing.assert_array_equal(one.stats, parts.stats)


def test_results_file_written_from_arrays_reads_back_as_the_records(tmp_path):
    import json

    from yolox_fast.evaluators.coco import coco_results_table, write_coco_results

    _, detections, class_ids = _crowded_case(images=3, per_image=7)
    path = tmp_path / "detections.json"
    write_coco_results(str(path), coco_results_table(detections, class_ids), rows_per_write=4)
    assert json.loads(path.read_text()) == detections_to_coco_json(detections, class_ids)
    write_coco_results(str(path), coco_results_table({}, class_ids))
    assert json.loads(path.read_text()) == []
