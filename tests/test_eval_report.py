"""The eval report: matching, precision/recall/F1 and the confusion matrix on hand-made cases, the
faster-coco-eval scorer against pycocotools, the report files of tools/eval.py and of training,
and the metric that picks best_ckpt.pth."""

import contextlib
import csv
import io
import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers import load_tool, run_tool_in_process
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from yolox_fast.core.best_metric import check_best_metric, resumed_best
from yolox_fast.evaluators import matching
from yolox_fast.evaluators.matching import ImageTruth, image_truth
from yolox_fast.evaluators.report import FILES, write_eval_report
from yolox_fast.evaluators.scorer import coco_evaluate, faster_coco_eval_available, summary_text

REPO = Path(__file__).resolve().parents[1]
EXP_FILE = str(REPO / "exps" / "example" / "shapes_nano.py")
SHAPES = ["circle", "square", "triangle", "star", "cross", "ring"]
needs_faster = pytest.mark.skipif(not faster_coco_eval_available(), reason="faster-coco-eval not installed")


def synthetic_coco_case(**kwargs):
    """The generator of `python tools/benchmark.py eval` (crowd boxes, empty images, a class never
    detected)."""
    from benchmarks.suites.eval import synthetic_coco_case

    return synthetic_coco_case(**kwargs)


def det(x1, y1, x2, y2, score, cls):
    return [x1, y1, x2, y2, score, cls]


def dets(*rows):
    return np.array(rows, dtype=np.float64).reshape(-1, 6)


# ---------------------------------------------------------------- confusion matrix
def test_confusion_matrix_counts_matches_confusions_misses_and_false_detections():
    truths = {
        # image 1: one box of each class
        1: image_truth([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [0, 1, 2]),
        # image 2: a class-1 box, a difficult class-2 box, a class-0 crowd region
        2: image_truth(
            [[0, 0, 10, 10], [20, 0, 30, 10], [50, 50, 100, 100]],
            [1, 2, 0],
            [False, True, True],
            [False, False, True],
        ),
        3: image_truth(np.zeros((0, 4)), []),  # no objects
        4: image_truth([[0, 0, 10, 10]], [0]),  # no detections at all (absent from `detections`)
    }
    detections = {
        1: dets(
            det(0, 0, 10, 10, 0.9, 0),  # right class on the class-0 box: diagonal
            det(20, 0, 30, 10, 0.8, 0),  # class 0 on the class-1 box: confusion [1, 0]
            det(0, 0, 10, 10, 0.7, 0),  # duplicate on a taken box: false detection [bg, 0]
            det(60, 60, 70, 70, 0.6, 1),  # on nothing: false detection [bg, 1]
            det(40, 0, 50, 10, 0.1, 2),  # below cm conf: not counted, so the class-2 box is missed
        ),
        2: dets(
            det(20, 0, 30, 10, 0.9, 2),  # on the difficult box: not counted
            det(60, 60, 70, 70, 0.9, 0),  # inside the crowd region (IoU 0.04, IoA 1): not counted
        ),
        3: dets(det(0, 0, 5, 5, 0.5, 2)),  # false detection [bg, 2]
    }
    cm = matching.confusion_matrix(detections, truths, num_classes=3, conf=0.25, iou_thr=0.45)
    expected = np.array(
        [
            [1, 0, 0, 1],  # class 0: matched once, missed in image 4
            [1, 0, 0, 1],  # class 1: taken for class 0 in image 1, missed in image 2
            [0, 0, 0, 1],  # class 2: missed (its detection is below conf); the difficult one is not counted
            [1, 1, 1, 0],  # background: false detections per predicted class
        ]
    )
    np.testing.assert_array_equal(cm, expected)
    normalised = matching.row_normalised(cm)
    np.testing.assert_allclose(normalised.sum(1), [1, 1, 1, 1])
    assert normalised[0, 0] == 0.5


def test_confusion_matrix_pairs_by_highest_iou_first_not_by_score():
    truth = {1: image_truth([[0, 0, 10, 10], [0, 0, 10, 12]], [0, 1])}
    # d1 (higher score) overlaps box 1 best (0.917) but d2 overlaps it exactly: d2 gets box 1, d1 box 0
    detections = {1: dets(det(0, 0, 10, 11, 0.9, 1), det(0, 0, 10, 12, 0.5, 1))}
    cm = matching.confusion_matrix(detections, truth, num_classes=2, conf=0.25, iou_thr=0.45)
    np.testing.assert_array_equal(cm, [[0, 1, 0], [0, 1, 0], [0, 0, 0]])
    # one detection cannot take two boxes: it takes the one of higher IoU, the other is missed
    cm = matching.confusion_matrix({1: dets(det(0, 0, 10, 11, 0.9, 1))}, truth, 2, 0.25, 0.45)
    np.testing.assert_array_equal(cm, [[0, 0, 1], [0, 1, 0], [0, 0, 0]])


# ---------------------------------------------------------------- class-aware matching, P / R / F1
def test_matching_takes_the_best_free_box_and_ignores_difficult_and_crowd():
    truth = image_truth(
        [[0, 0, 10, 10], [0, 0, 10, 12], [50, 0, 60, 10], [100, 100, 200, 200]],
        [0, 0, 0, 0],
        [False, False, True, True],
        [False, False, False, True],
    )
    rows = dets(
        det(0, 0, 10, 10, 0.9, 0),  # best box 0: TP
        det(0, 0, 10, 10, 0.8, 0),  # box 0 taken, box 1 still free at IoU 0.83: TP
        det(0, 0, 10, 10, 0.7, 0),  # both taken: FP
        det(50, 0, 60, 10, 0.6, 0),  # difficult box: ignored
        det(120, 120, 130, 130, 0.5, 0),  # inside the crowd region: ignored
        det(50, 0, 60, 10, 0.4, 1),  # other class on the difficult box: FP
    )
    result = matching.match_detections(rows[::-1].copy(), truth, 0.5)[::-1]  # order given does not matter
    tp, fp, ignored = matching.TP, matching.FP, matching.IGNORED
    assert result.tolist() == [tp, tp, fp, ignored, ignored, fp]


def _four_box_class():
    truth = {
        1: image_truth([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10], [60, 0, 70, 10]], [0, 0, 0, 0])
    }
    detections = {
        1: dets(
            det(0, 0, 10, 10, 0.9, 0),  # TP
            det(80, 80, 90, 90, 0.8, 0),  # FP
            det(20, 0, 30, 10, 0.6, 0),  # TP
            det(40, 0, 50, 10, 0.3, 0),  # TP
            det(0, 0, 10, 10, 0.1, 0),  # duplicate: FP
        )
    }
    return matching.match_by_class(detections, truth, num_classes=2)


def test_precision_and_recall_at_a_confidence():
    m, empty = _four_box_class()
    assert (m.num_gt, m.num_images, len(m.scores)) == (4, 1, 5)
    p, r = matching.precision_recall_at(m, np.array([0.5, 0.25, 0.95, 0.0]))
    np.testing.assert_allclose(p, [2 / 3, 3 / 4, 0.0, 3 / 5])  # precision 0 where nothing passes
    np.testing.assert_allclose(r, [2 / 4, 3 / 4, 0.0, 3 / 4])
    p, r = matching.precision_recall_at(empty, 0.5)  # a class without ground truth or detections
    assert p == 0.0 and np.isnan(r)


def test_pr_envelope_is_the_best_precision_at_or_beyond_each_recall():
    m, _ = _four_box_class()
    env = matching.pr_envelope(m, np.array([0.0, 0.25, 0.5, 0.75, 1.0]))
    # (precision, recall) along the ranking: (1, .25) (.5, .25) (.67, .5) (.75, .75) (.6, .75)
    np.testing.assert_allclose(env, [1.0, 1.0, 0.75, 0.75, 0.0])


def _slow_f1(matches, confs):
    """F1 by counting detections one by one at each confidence."""
    out = np.full((len(matches), len(confs)), np.nan)
    for c, m in enumerate(matches):
        if m.num_gt == 0:
            continue
        for i, conf in enumerate(confs):
            kept = [t for s, t in zip(m.scores, m.tp) if s >= conf]
            tp = sum(kept)
            p = tp / len(kept) if kept else 0.0
            r = tp / m.num_gt
            out[c, i] = 2 * p * r / (p + r) if p + r else 0.0
    return out


def test_f1_curves_and_best_threshold_equal_a_slow_count():
    coco, records = synthetic_coco_case(num_images=40, num_classes=5, dets_per_image=15, seed=3)
    truths, detections = _truths_and_detections(coco, records)
    matches = matching.match_by_class(detections, truths, 5)
    confs = np.linspace(0, 1, 101)
    f1 = matching.f1_curves(matches, confs)
    np.testing.assert_allclose(f1, _slow_f1(matches, confs), equal_nan=True)
    best, at, mean = matching.best_f1(f1, confs)
    with_gt = [c for c, m in enumerate(matches) if m.num_gt]
    slow_mean = np.mean([_slow_f1([matches[c]], confs)[0] for c in with_gt], axis=0)
    i = int(np.argmax(slow_mean))
    assert (best, at) == (pytest.approx(slow_mean[i]), confs[i])
    np.testing.assert_allclose(mean, slow_mean)


def test_best_f1_prefers_the_lowest_confidence_on_a_tie():
    f1 = np.array([[0.2, 0.5, 0.5, 0.1], [np.nan] * 4])  # second class: no ground truth, left out
    best, at, mean = matching.best_f1(f1, np.array([0.0, 0.3, 0.6, 0.9]))
    assert (best, at) == (0.5, 0.3) and mean.tolist() == [0.2, 0.5, 0.5, 0.1]


def _truths_and_detections(coco: COCO, records):
    """ImageTruth (crowd boxes as ignore regions) and (K, 6) detections straight from COCO dicts."""
    index = {cid: i for i, cid in enumerate(sorted(coco.getCatIds()))}
    truths, detections = {}, {}
    for img_id in coco.getImgIds():
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[img_id]))
        boxes = [
            [a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
            for a in anns
        ]
        crowd = [bool(a["iscrowd"]) for a in anns]
        truths[img_id] = image_truth(
            np.reshape(boxes, (-1, 4)), [index[a["category_id"]] for a in anns], crowd, crowd
        )
        detections[img_id] = np.zeros((0, 6))
    rows = {}
    for r in records:
        x, y, w, h = r["bbox"]
        rows.setdefault(r["image_id"], []).append([x, y, x + w, y + h, r["score"], index[r["category_id"]]])
    detections.update({k: np.array(v) for k, v in rows.items()})
    return truths, detections


def test_matching_reproduces_pycocotools_ap50_per_class():
    """Mean interpolated precision at 101 recall points of our matching == COCOeval's AP50, class by
    class, crowd regions included (fewer than 100 detections per image, so COCOeval's cap is moot)."""
    coco, records = synthetic_coco_case(
        num_images=80, num_classes=8, dets_per_image=30, crowd_fraction=0.1, seed=1
    )
    truths, detections = _truths_and_detections(coco, records)
    matches = matching.match_by_class(detections, truths, 8, iou_thr=0.5)
    score = coco_evaluate(coco, records, sorted(coco.getImgIds()), "pycocotools")
    for k, m in enumerate(matches):
        ap50 = score.precision[0, :, k, 0, -1]
        ours = matching.pr_envelope(m, np.linspace(0, 1, 101))
        np.testing.assert_allclose(ours, ap50, atol=1e-12, err_msg=f"class {k}")


# ---------------------------------------------------------------- faster-coco-eval against pycocotools
def _pycocotools_printout(coco: COCO, records, img_ids):
    out = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(coco, coco.loadRes([dict(r) for r in records]), "bbox")
        ev.params.imgIds = img_ids
        ev.evaluate()
        ev.accumulate()
    with contextlib.redirect_stdout(out):
        ev.summarize()
    return ev.stats, out.getvalue()


@needs_faster
def test_faster_coco_eval_equals_pycocotools_with_crowds_empty_images_and_undetected_classes():
    coco, records = synthetic_coco_case(
        num_images=150, num_classes=12, dets_per_image=40, crowd_fraction=0.05, empty_fraction=0.1, seed=2
    )
    no_dets = {5, 6, 7}  # images without any detection (one of them may also be empty)
    records = [r for r in records if r["image_id"] not in no_dets]
    anns = coco.dataset["annotations"]
    assert any(a["iscrowd"] for a in anns)
    assert len({a["image_id"] for a in anns}) < len(coco.getImgIds())  # some images have no object
    last = max(coco.getCatIds())
    assert any(a["category_id"] == last for a in anns) and all(r["category_id"] != last for r in records)
    img_ids = sorted(coco.getImgIds())
    slow = coco_evaluate(coco, records, img_ids, "pycocotools")
    fast = coco_evaluate(coco, records, img_ids, "faster-coco-eval")
    assert slow.scorer.startswith("pycocotools") and fast.scorer.startswith("faster-coco-eval")
    np.testing.assert_allclose(fast.stats, slow.stats, atol=1e-4)
    np.testing.assert_allclose(fast.precision, slow.precision, atol=1e-4)
    np.testing.assert_allclose(fast.recall, slow.recall, atol=1e-4)
    stats, printed = _pycocotools_printout(coco, records, img_ids)
    assert summary_text(fast.stats) == printed  # the twelve lines, character for character
    np.testing.assert_array_equal(slow.stats, stats)
    assert 0.01 < stats[0] < 0.99  # neither trivial nor perfect
    # a subset of the images, and no detections at all
    np.testing.assert_allclose(
        coco_evaluate(coco, records, img_ids[:40], "faster-coco-eval").stats,
        coco_evaluate(coco, records, img_ids[:40], "pycocotools").stats,
        atol=1e-4,
    )
    np.testing.assert_allclose(
        coco_evaluate(coco, [], img_ids, "faster-coco-eval").stats,
        coco_evaluate(coco, [], img_ids, "pycocotools").stats,
        atol=1e-4,
    )


def test_auto_falls_back_to_pycocotools_without_faster_coco_eval(monkeypatch):
    from yolox_fast.evaluators import scorer

    coco, records = synthetic_coco_case(num_images=5, num_classes=2, dets_per_image=3)
    monkeypatch.setattr(scorer, "faster_coco_eval_available", lambda: False)
    assert coco_evaluate(coco, records, [1, 2, 3, 4, 5], "auto").scorer.startswith("pycocotools")
    with pytest.raises(ImportError, match="pip install faster-coco-eval"):
        coco_evaluate(coco, records, [1, 2], "faster-coco-eval")


def test_unknown_scorer_is_a_clear_error():
    coco, records = synthetic_coco_case(num_images=2, num_classes=2, dets_per_image=2)
    with pytest.raises(ValueError, match="unknown COCO scorer 'fast'"):
        coco_evaluate(coco, records, [1, 2], "fast")


# ---------------------------------------------------------------- report files (oracle detector)
def _evaluated(config: str, noise: bool):
    from oracle_model import oracle_for, shapes_exp

    from yolox_fast.evaluators.build import build_evaluator

    exp = shapes_exp(config)
    evaluator = build_evaluator(exp, batch_size=3, is_distributed=False)
    model, _ = oracle_for(evaluator.dataloader.dataset, exp.num_classes, exp.test_size, noise=noise)
    evaluator.evaluate(model)
    return exp, evaluator


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_perfect_detector_report(tiny_shapes_coco, tmp_path):
    exp, evaluator = _evaluated(tiny_shapes_coco["config"], noise=False)
    report = write_eval_report(evaluator, exp, str(tmp_path))
    for name in FILES.values():
        assert (tmp_path / name).is_file(), name
    rows = _csv_rows(tmp_path / "per_class.csv")
    assert [r["class"] for r in rows] == [*SHAPES, "all"]
    for r in rows:
        assert float(r["precision"]) == 1.0 and float(r["recall"]) == 1.0 and float(r["AP50"]) == 1.0
    cm = np.array(json.loads((tmp_path / "confusion_matrix.json").read_text())["matrix"])
    instances = [int(r["instances"]) for r in rows[:-1]]
    np.testing.assert_array_equal(np.diag(cm)[:-1], instances)
    assert cm.sum() == sum(instances)  # nothing missed, nothing false
    assert report.best_f1 == 1.0


def test_noisy_detector_report_agrees_with_the_coco_summary(tiny_shapes_coco, tmp_path, log_lines):
    exp, evaluator = _evaluated(tiny_shapes_coco["config"], noise=True)
    scorer = "faster-coco-eval" if faster_coco_eval_available() else "pycocotools"
    assert any(line.startswith(f"COCO AP scored by {scorer}") for line in log_lines)
    report = write_eval_report(evaluator, exp, str(tmp_path))
    stats = evaluator.last_result["stats"]
    all_row = report.rows[-1]
    for i, key in enumerate(("AP50_95", "AP50", "AP75", "AP_small", "AP_medium")):
        assert all_row[key] == pytest.approx(stats[i], abs=1e-9), key
    assert np.isnan(all_row["AP_large"]) and stats[5] == -1  # no large box in 128 px images: undefined
    rows = _csv_rows(tmp_path / "per_class.csv")
    assert rows[-1]["AP_large"] == ""
    for r, name in zip(rows, SHAPES):
        assert r["class"] == name
        assert float(r["AP50_95"]) == pytest.approx(evaluator.last_result["per_class_ap"][name])
    assert 0 < all_row["precision"] < 1 and 0 < all_row["recall"] < 1
    assert report.rows[-1]["instances"] == sum(r["instances"] for r in report.rows[:-1])
    cm = report.confusion
    assert cm[:-1].sum() == report.rows[-1]["instances"]  # every regular box is counted once
    assert cm[-1, :-1].sum() > 0  # the oracle's false positives land in the background row


def test_detections_json_rescored_by_plain_pycocotools_gives_the_printed_ap(tiny_shapes_coco, tmp_path):
    exp, evaluator = _evaluated(tiny_shapes_coco["config"], noise=True)
    write_eval_report(evaluator, exp, str(tmp_path))
    dataset = evaluator.dataloader.dataset
    records = json.loads((tmp_path / "detections.json").read_text())
    assert {r["category_id"] for r in records} <= set(dataset.class_ids)
    assert {r["image_id"] for r in records} <= set(dataset.ids)
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(dataset.ann_path)
        ev = COCOeval(gt, gt.loadRes(str(tmp_path / "detections.json")), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    assert ev.stats[0] == pytest.approx(evaluator.last_result["ap50_95"], abs=1e-4)
    assert ev.stats[1] == pytest.approx(evaluator.last_result["ap50"], abs=1e-4)


def test_voc_report_has_voc_aps_and_no_area_columns(tiny_shapes_voc, tmp_path):
    from yolox_fast.evaluators.report import report_table

    exp, evaluator = _evaluated(tiny_shapes_voc["config"], noise=True)
    report = write_eval_report(evaluator, exp, str(tmp_path))
    rows = _csv_rows(tmp_path / "per_class.csv")
    for r in rows[:-1]:
        assert float(r["AP50"]) == pytest.approx(evaluator.last_result["per_class_ap50"][r["class"]])
        assert r["AP_small"] == r["AP_medium"] == r["AP_large"] == ""
    assert float(rows[-1]["AP50"]) == pytest.approx(evaluator.last_result["ap50"])
    assert float(rows[-1]["AP50_95"]) == pytest.approx(evaluator.last_result["ap50_95"])
    assert "n/a" in report_table(report)


def test_report_on_a_rank_that_did_not_score_is_none(tiny_shapes_coco, tmp_path):
    exp, evaluator = _evaluated(tiny_shapes_coco["config"], noise=False)
    evaluator.last_merged = None  # what ranks other than 0 hold
    assert write_eval_report(evaluator, exp, str(tmp_path / "eval")) is None
    assert not (tmp_path / "eval").exists()


# ---------------------------------------------------------------- tools/eval.py as a user runs it
def _random_checkpoint(path: Path) -> None:
    from yolox_fast.exp import get_exp
    from yolox_fast.utils.checkpoint import save_checkpoint

    model = get_exp(EXP_FILE).get_model()
    save_checkpoint({"model": model.state_dict(), "class_names": SHAPES}, path)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["coco", "voc"])
def test_eval_tool_writes_every_report_file(fmt, tiny_shapes_coco, tiny_shapes_voc, tmp_path):
    config = (tiny_shapes_coco if fmt == "coco" else tiny_shapes_voc)["config"]
    ckpt = tmp_path / "random.pth"
    _random_checkpoint(ckpt)
    args = ["-f", EXP_FILE, "-c", str(ckpt), "-b", "4", "--conf", "1e-6", "--report-conf", "0.3"]
    args += ["--cm-iou", "0.5", "dataset", config, "test_size", "(64,64)", "data_num_workers", "0"]
    out = run_tool_in_process("eval", *args, "output_dir", str(tmp_path))  # as typed, in this process
    report_dir = tmp_path / "shapes_nano" / "eval"
    for name in FILES.values():
        assert (report_dir / name).is_file(), name
    assert f"eval report written to {report_dir}: per_class.csv, confusion_matrix.png" in out
    assert re.search(r"best F1 \d\.\d\d at conf \d\.\d\d", out)
    rows = _csv_rows(report_dir / "per_class.csv")
    assert [r["class"] for r in rows] == [*SHAPES, "all"] and rows[0]["report_conf"] == "0.3"
    assert "P@0.3" in out and "triangle" in out
    assert json.loads((report_dir / "confusion_matrix.json").read_text())["iou"] == 0.5
    records = json.loads((report_dir / "detections.json").read_text())
    assert records, "the random model at conf 1e-6 should still detect something"
    if fmt == "coco":
        printed = re.search(r"AP50:95 ([\d.]+)  AP50 ([\d.]+)", out)
        ann_file = json.loads(Path(config).read_text())["val"]["ann"]
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO(str(Path(config).parent / "annotations" / ann_file))
            ev = COCOeval(gt, gt.loadRes(records), "bbox")
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        assert (f"{ev.stats[0]:.4f}", f"{ev.stats[1]:.4f}") == printed.groups()


def test_eval_tool_rejects_bad_report_thresholds():
    tool = load_tool("eval")
    args = tool.parse_with_overrides(tool.make_parser(), ["-f", EXP_FILE, "--cm-iou", "1.5"])
    with pytest.raises(ValueError, match="cm_iou"):
        tool.build_eval_exp(args)


# ---------------------------------------------------------------- training: pictures and best metric
@pytest.mark.slow
def test_training_writes_the_report_to_eval_best_eval_and_tensorboard(tiny_shapes_coco, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_trainer import train_args

    from yolox_fast.core.trainer import run_training

    run_training(
        train_args(tiny_shapes_coco["config"], tmp_path, max_epoch=1, no_aug_epochs=0, save_eval_report=True)
    )
    run = tmp_path / "run"
    for folder in ("eval", "best_eval"):
        for name in FILES.values():
            assert (run / folder / name).is_file(), f"{folder}/{name}"
    assert [r["class"] for r in _csv_rows(run / "eval" / "per_class.csv")] == [*SHAPES, "all"]
    log = (run / "train_log.txt").read_text()
    assert "eval report epoch 1: best F1" in log and "best_eval" in log
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert {"val/confusion_matrix", "val/confusion_matrix_normalized", "val/PR_curve", "val/F1_curve"} <= set(
        events.Tags()["images"]
    )


SCRIPTED = [(0.30, 0.50), (0.35, 0.45), (0.20, 0.60)]  # (AP50:95, AP50) of epochs 1, 2, 3


def _trainer_with_scripted_evals(config, tmp_path, monkeypatch, best_metric, *flags):
    from test_trainer import train_args

    from yolox_fast.core.trainer import Trainer
    from yolox_fast.exp import get_exp

    args = train_args(config, tmp_path, "--logger", "none", *flags, best_metric=best_metric, max_epoch=5)
    exp = get_exp(args.exp_file)
    exp.merge(args.opts)
    trainer = Trainer(exp, args)
    values = iter(SCRIPTED)
    monkeypatch.setattr(exp, "eval", lambda *a, **k: (*next(values), "scripted"))
    trainer.before_train()
    trainer.stop_signal.restore()
    return trainer


@pytest.mark.parametrize("best_metric, best_epochs", [("AP50", [1, 3]), ("AP50_95", [1, 2])])
def test_best_metric_picks_what_best_ckpt_keeps(
    best_metric, best_epochs, tiny_shapes_coco, tmp_path, monkeypatch
):
    from yolox_fast.utils.checkpoint import load_checkpoint

    trainer = _trainer_with_scripted_evals(tiny_shapes_coco["config"], tmp_path, monkeypatch, best_metric)
    improved = []
    for epoch in range(3):
        trainer.epoch = epoch
        if trainer.evaluate_and_save_model():
            improved.append(epoch + 1)
    assert improved == best_epochs
    best = load_checkpoint(Path(trainer.run_dir) / "best_ckpt.pth")
    value = max(SCRIPTED[e - 1][0 if best_metric == "AP50_95" else 1] for e in best_epochs)
    assert (best["best_metric"], best["best_ap"], best["start_epoch"]) == (
        best_metric,
        value,
        best_epochs[-1],
    )
    label = "AP50:95" if best_metric == "AP50_95" else "AP50"
    assert f"(best {label} {value:.4f}" in (Path(trainer.run_dir) / "train_log.txt").read_text()


def test_resume_with_another_best_metric_starts_the_best_afresh(tiny_shapes_coco, tmp_path, monkeypatch):
    trainer = _trainer_with_scripted_evals(tiny_shapes_coco["config"], tmp_path, monkeypatch, "AP50")
    trainer.epoch = 0
    trainer.evaluate_and_save_model()
    trainer.checkpointer.save("latest", start_epoch=1, it=0, epoch=0)
    same = _trainer_with_scripted_evals(tiny_shapes_coco["config"], tmp_path, monkeypatch, "AP50", "--resume")
    assert same.checkpointer.best.score == 0.50
    other = _trainer_with_scripted_evals(
        tiny_shapes_coco["config"], tmp_path, monkeypatch, "AP50_95", "--resume"
    )
    assert other.checkpointer.best.score == float("-inf")
    log = (Path(other.run_dir) / "train_log.txt").read_text()
    assert "best value 0.5000 is AP50, but exp.best_metric is AP50_95" in log


def test_resumed_best_of_old_and_new_checkpoints(log_lines):
    old = {"best_ap": 0.4}  # before best_metric was stored (and official YOLOX): AP50:95
    assert resumed_best(old, "AP50_95") == 0.4
    assert resumed_best(old, "AP50") == float("-inf")
    assert any("is AP50:95, but exp.best_metric is AP50" in line for line in log_lines)
    assert resumed_best({"best_ap": 0.7, "best_metric": "AP50"}, "AP50") == 0.7
    assert resumed_best({}, "AP50") == float("-inf")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("best_metric", "AP75", r"'best_metric' to 'AP75': expected Literal\['AP50_95', 'AP50'\]"),
        ("report_conf", "1.5", r"exp.report_conf must be a confidence in \[0, 1\]"),
        ("cm_iou", "0", r"exp.cm_iou must be an IoU in \(0, 1\]"),
        ("coco_scorer", "fast", r"'coco_scorer' to 'fast': expected Literal\['auto', 'faster-coco-eval'"),
    ],
)
def test_bad_eval_settings_fail_at_merge_or_validation(key, value, message):
    """Choices are refused by merge (their type), ranges by validate (every tool and the trainer run it)."""
    from yolox_fast.exp import get_exp

    exp = get_exp(EXP_FILE)
    with pytest.raises(ValueError, match=message):
        exp.merge([key, value])
        exp.validate()


def test_trainer_refuses_an_unknown_best_metric(tmp_path):
    from test_trainer import train_args

    from yolox_fast.core.trainer import Trainer
    from yolox_fast.exp import get_exp

    args = train_args("shapes", tmp_path)
    exp = get_exp(args.exp_file)
    exp.best_metric = "mAP"  # set in an exp file, not through merge
    with pytest.raises(ValueError, match="best_metric"):
        Trainer(exp, args)
    assert check_best_metric("AP50") == "AP50"


def test_image_truth_of_a_coco_dataset_holds_its_crowd_boxes(tmp_path):
    from yolox_fast.data.datasets.coco import COCODataset

    (tmp_path / "annotations").mkdir()
    (tmp_path / "img").mkdir()
    cv2.imwrite(str(tmp_path / "img" / "a.jpg"), np.zeros((50, 60, 3), np.uint8))
    ann = {
        "images": [{"id": 7, "width": 60, "height": 50, "file_name": "a.jpg"}],
        "categories": [{"id": 3, "name": "cat"}, {"id": 9, "name": "dog"}],
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 9, "bbox": [1, 2, 10, 20], "area": 200, "iscrowd": 0},
            {"id": 2, "image_id": 7, "category_id": 3, "bbox": [30, 10, 20, 30], "area": 600, "iscrowd": 1},
        ],
    }
    (tmp_path / "annotations" / "val.json").write_text(json.dumps(ann))
    dataset = COCODataset(str(tmp_path), "img", "val.json", img_size=(64, 64))
    truth: ImageTruth = matching.ground_truth_of(dataset, [7])[7]
    np.testing.assert_allclose(truth.boxes, [[1, 2, 11, 22], [30, 10, 50, 40]])
    assert truth.classes.tolist() == [1, 0]
    assert truth.ignore.tolist() == [False, True] and truth.crowd.tolist() == [False, True]
