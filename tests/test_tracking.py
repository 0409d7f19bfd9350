"""Tracking: the Kalman filter follows constant motion; the assignment is optimal and gated; ByteTrack keeps
an id through low-score and missed frames where the IoU tracker loses it; tracks are written in MOT format;
the generated scenes and the benchmark; `tools/demo.py video --track` as typed."""

import itertools
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from helpers import load_tool
from test_export import _lively_nano

from yolox_fast.tracking import ByteTracker, IoUTracker, mot_lines, read_mot
from yolox_fast.tracking.association import match
from yolox_fast.tracking.kalman import BoxKalmanFilter, xyah_to_xyxy, xyxy_to_xyah
from yolox_fast.tracking.scenes import KINDS, draw_frame, make_scene, simulate_detections


def _box(x: float, y: float = 50.0, w: float = 40.0, h: float = 80.0) -> np.ndarray:
    return np.array([x, y, x + w, y + h])


def test_box_conversions_round_trip():
    box = np.array([10.0, 20.0, 50.0, 100.0])
    np.testing.assert_allclose(xyxy_to_xyah(box), [30.0, 60.0, 0.5, 80.0])
    np.testing.assert_allclose(xyah_to_xyxy(xyxy_to_xyah(box)), box)


def test_kalman_filter_learns_a_constant_velocity_and_predicts_the_next_box():
    kf = BoxKalmanFilter(_box(0.0))
    for t in range(1, 30):
        kf.predict()
        kf.update(_box(4.0 * t))
    kf.predict()
    np.testing.assert_allclose(kf.box, _box(4.0 * 30), atol=0.5)
    np.testing.assert_allclose(kf.mean[4], 4.0, atol=0.05)  # px per frame


def test_match_is_the_minimum_cost_assignment_within_the_gate():
    rng = np.random.default_rng(0)
    for rows, cols in [(3, 4), (4, 3), (4, 4)]:
        cost = rng.uniform(0, 1, (rows, cols))
        pairs, left_rows, left_cols = match(cost, max_cost=0.7)
        assert all(cost[r, c] <= 0.7 for r, c in pairs)
        assert sorted(left_rows + [r for r, _ in pairs]) == list(range(rows))
        assert sorted(left_cols + [c for _, c in pairs]) == list(range(cols))

        # brute force: the most pairs under the gate, then the least total cost, over every partial matching
        def value(assignment):
            kept = [(r, c) for r, c in assignment if c is not None and cost[r, c] <= 0.7]
            return (-len(kept), sum(cost[r, c] for r, c in kept))

        options = list(range(cols)) + [None] * rows
        best = min(
            value(list(zip(range(rows), perm)))
            for perm in itertools.permutations(options, rows)
            if len({c for c in perm if c is not None}) == sum(c is not None for c in perm)
        )
        assert value(pairs) == pytest.approx(best)
    assert match(np.zeros((0, 3)), 0.5) == ([], [], [0, 1, 2])


def test_a_track_follows_its_object_across_class_flips_and_takes_the_latest_class():
    tracker = ByteTracker()
    for t, cls in enumerate([0, 1, 1, 2, 0]):  # a look-alike detector's classes for one object
        tracks = tracker.update(np.array([[*_box(3.0 * t), 0.9, cls]]))
    assert tracks[:, 4].tolist() == [1] and tracks[:, 6].tolist() == [0]


def _walk(frames: int, score_at=lambda t: 0.9, missing=()) -> list[np.ndarray]:
    """One object moving right 5 px a frame: per frame its detection (K, 6), none in `missing` frames."""
    return [
        np.zeros((0, 6)) if t in missing else np.array([[*_box(5.0 * t), score_at(t), 0]])
        for t in range(frames)
    ]


@pytest.mark.parametrize("tracker", [ByteTracker, IoUTracker])
def test_a_steady_object_keeps_one_id(tracker):
    t = tracker()
    ids = {int(tr[4]) for dets in _walk(20) for tr in t.update(dets)}
    assert ids == {1}


def test_bytetrack_keeps_the_id_through_low_scores_and_missed_frames_where_iou_tracking_does_not():
    # frames 8-10: the object is half hidden (score 0.3); frames 14-18: not detected at all
    frames = _walk(30, score_at=lambda t: 0.3 if 8 <= t <= 10 else 0.9, missing=range(14, 19))
    byte, iou = ByteTracker(), IoUTracker()
    byte_ids, iou_ids, seen_low = set(), set(), []
    for t, dets in enumerate(frames):
        tracks = byte.update(dets)
        byte_ids |= {int(tr[4]) for tr in tracks}
        if 8 <= t <= 10:
            seen_low.append(len(tracks))
        iou_ids |= {int(tr[4]) for tr in iou.update(dets)}
    assert byte_ids == {1} and seen_low == [1, 1, 1]  # the low-score boxes continue the track
    assert len(iou_ids) == 3  # a new id after the low-score frames and after the gap


def test_bytetrack_drops_a_single_frame_false_positive_and_forgets_long_lost_tracks():
    tracker = ByteTracker()
    tracker.update(np.array([[*_box(0.0), 0.9, 0]]))
    flash = tracker.update(np.array([[*_box(0.0), 0.9, 0], [*_box(300.0), 0.9, 0]]))
    assert [int(t[4]) for t in flash] == [1]  # a newborn is shown once a second frame confirms it
    tracker.update(np.array([[*_box(0.0), 0.9, 0]]))
    assert [t.id for t in tracker.tracks] == [1]
    for _ in range(tracker.settings.max_lost + 1):
        tracker.update(np.zeros((0, 6)))
    assert tracker.tracks == []


def test_mot_lines_round_trip(tmp_path):
    tracks = np.array([[10.0, 20.0, 50.0, 100.0, 3, 0.875, 0], [0.5, 1.5, 2.5, 4.5, 7, 0.5, 1]])
    lines = mot_lines(12, tracks)
    assert lines[0] == "12,3,10.00,20.00,40.00,80.00,0.8750,-1,-1,-1"
    path = tmp_path / "tracks.txt"
    path.write_text("\n".join(lines + mot_lines(13, tracks[:1])) + "\n")
    read = read_mot(path)
    assert sorted(read) == [12, 13]
    np.testing.assert_allclose(read[12], tracks[:, [4, 0, 1, 2, 3, 5]])


@pytest.mark.parametrize("kind", KINDS)
def test_scenes_are_seeded_and_hide_what_is_behind_a_pillar(kind):
    scene = make_scene(kind, seed=3, num_frames=40)
    again = make_scene(kind, seed=3, num_frames=40)
    np.testing.assert_array_equal(scene.boxes, again.boxes)
    assert scene.boxes.shape[:2] == scene.visible.shape and draw_frame(scene, 0).shape == (480, 640, 3)
    dets = simulate_detections(scene, seed=1)
    assert len(dets) == 40 and all(d.shape[1] == 6 for d in dets)
    for pillar in scene.pillars:
        inside = (scene.boxes[..., 0] >= pillar[0]) & (scene.boxes[..., 2] <= pillar[2])  # (F, N)
        assert (scene.visible[inside] == 0).all()


@pytest.mark.parametrize("kind", ["crossing", "occlusion"])
def test_bytetrack_beats_iou_tracking_on_crossings_and_occlusions(kind):
    """The benchmark's claim on one generated video each: IDF1 well above the IoU tracker's, fewer
    switches."""
    mm = pytest.importorskip("motmetrics")
    from benchmarks.suites.track import run_tracker

    scene = make_scene(kind, seed=0, num_frames=100)
    dets = simulate_detections(scene, seed=0)
    scores = {}
    for name, tracker in (("byte", ByteTracker), ("iou", IoUTracker)):
        acc = mm.MOTAccumulator(auto_id=True)
        run_tracker(tracker, scene, dets, acc)
        scores[name] = mm.metrics.create().compute(acc, metrics=["idf1", "num_switches"]).iloc[0]
    assert scores["byte"]["idf1"] > scores["iou"]["idf1"] + 0.2, scores
    assert scores["byte"]["num_switches"] < scores["iou"]["num_switches"], scores


@pytest.mark.slow
def test_track_benchmark_prints_both_trackers_and_the_time_share(tmp_path, capsys):
    pytest.importorskip("motmetrics")
    from benchmarks.suites import track

    track.main(["--videos", "1", "--frames", "30", "--detect-frames", "2", "--tsize", "64",
                "--save-frames", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    for kind in KINDS:
        assert [kind, "ByteTrack", "(ours)"] in [row[:3] for row in rows]
        assert [kind, "IoU", "tracker"] in [row[:3] for row in rows]
    assert "% of it" in out
    assert len(list(tmp_path.glob("crossing_*.png"))) > 0


@pytest.mark.slow
def test_demo_video_track_writes_ids_in_mot_format(tiny_shapes_coco, tmp_path):
    """As typed: a video made of generated frames, a checkpoint, `demo.py video --track --save_result`."""
    _, model = _lively_nano(tiny_shapes_coco["config"], 64)
    ckpt = tmp_path / "lively.pth"
    torch.save({"model": model.state_dict()}, ckpt)
    scene = make_scene("crossing", seed=0, num_frames=12, size=(96, 128))
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (128, 96))
    for frame in range(scene.num_frames):
        writer.write(draw_frame(scene, frame))
    writer.release()
    argv = ["video", "-n", "yolox-nano", "-c", str(ckpt), "--tsize", "64", "--path", str(video), "--track"]
    argv += ["--save_result", "-b", "4", "num_classes", "6", "output_dir", str(tmp_path), "-expn", "t"]
    load_tool("demo").main(argv)
    (mot,) = Path(tmp_path / "t" / "vis_res").glob("*/clip.txt")
    (drawn,) = mot.parent.glob("clip.mp4")
    assert cv2.VideoCapture(str(drawn)).get(cv2.CAP_PROP_FRAME_COUNT) == scene.num_frames
    lines = mot.read_text().splitlines()
    for line in lines:
        fields = line.split(",")
        assert len(fields) == 10 and 1 <= int(fields[0]) <= scene.num_frames and int(fields[1]) >= 1
    with pytest.raises(ValueError, match="not images"):
        load_tool("demo").main(["image", "-n", "yolox-nano", "-c", str(ckpt), "--track", "num_classes", "6"])
