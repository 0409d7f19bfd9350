"""Tracking: ByteTrack's association against a plain IoU tracker on generated videos with known tracks.

    python tools/benchmark.py track                          # 3 kinds x 5 videos x 150 frames, 640x480
    python tools/benchmark.py track --videos 2 --frames 60 --save-frames tracked/   # quick, and pictures

Each video (`yolox_fast.tracking.scenes`: objects crossing, passing behind pillars, bouncing at random) has
its detections simulated from the truth (box jitter, scores that fall as an object is hidden, 3% misses,
false boxes), the same detections for both trackers. Scored with `motmetrics` (MOTA, IDF1, identity switches,
false positives, misses) over the boxes a detector could see (at least 25% visible), a match at IoU >= 0.5.
"track ms/frame" is the tracker's update alone; "detect ms/frame" is the yolox-nano Predictor (letterbox,
forward, NMS; random weights: only the time counts) at --tsize on the drawn frames, batch 1, in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from loguru import logger
from tabulate import tabulate

from yolox_fast.exp import get_exp
from yolox_fast.inference import Predictor
from yolox_fast.tracking import ByteTracker, IoUTracker
from yolox_fast.tracking.scenes import KINDS, Scene, draw_frame, make_scene, simulate_detections
from yolox_fast.utils.boxes import bboxes_iou
from yolox_fast.utils.visualize import draw_tracks

TRACKERS = {"ByteTrack (ours)": ByteTracker, "IoU tracker": IoUTracker}
MATCH_IOU = 0.5  # a track box counts for a true object at IoU >= 0.5 (MOT Challenge's criterion)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("python tools/benchmark.py track")
    p.add_argument("--videos", type=int, default=5, help="generated videos per kind (seeds 0..N-1)")
    p.add_argument("--frames", type=int, default=150, help="frames per video")
    p.add_argument("--tsize", type=int, default=416, help="detector input size for the detection time")
    p.add_argument("--detect-frames", type=int, default=30, help="frames the detection time is measured on")
    p.add_argument("--save-frames", default=None, help="folder for a few frames of each kind, ids drawn")
    return p


def distances(truth_boxes: np.ndarray, track_boxes: np.ndarray) -> np.ndarray:
    """(M, T) 1 - IoU of true boxes (M, 4) and track boxes (T, 4), NaN where IoU < MATCH_IOU (motmetrics'
    "cannot match")."""
    iou = bboxes_iou(torch.from_numpy(truth_boxes), torch.from_numpy(track_boxes.reshape(-1, 4))).numpy()
    return np.where(iou >= MATCH_IOU, 1.0 - iou, np.nan)


def run_tracker(make_tracker, scene: Scene, detections: list[np.ndarray], accumulator) -> list[float]:
    """Track one video into a motmetrics accumulator; the seconds of each update."""
    tracker = make_tracker()
    seconds = []
    for frame, dets in enumerate(detections):
        start = time.perf_counter()
        tracks = tracker.update(dets)  # (T, 7) x1, y1, x2, y2, id, score, class
        seconds.append(time.perf_counter() - start)
        ids, boxes = scene.truth(frame)
        accumulator.update(ids.tolist(), tracks[:, 4].astype(int).tolist(), distances(boxes, tracks[:, :4]))
    return seconds


def detection_ms(frames: list[np.ndarray], tsize: int) -> float:
    """Median ms per frame of the nano Predictor at batch 1 on `frames` (after one warm-up frame)."""
    exp = get_exp(exp_name="yolox-nano")
    torch.manual_seed(0)
    predictor = Predictor(exp.get_model().eval(), exp.num_classes, (tsize, tsize), 0.1, 0.45, "cpu")
    predictor.predict(frames[:1])
    times = []
    for frame in frames:
        start = time.perf_counter()
        predictor.predict([frame])
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def save_frames(folder: Path, kind: str, scene: Scene, detections: list[np.ndarray]) -> None:
    """Every 10th frame of the second half, ByteTrack's ids left and the IoU tracker's right."""
    folder.mkdir(parents=True, exist_ok=True)
    trackers = {name: make() for name, make in TRACKERS.items()}
    for frame, dets in enumerate(detections):
        drawn = []
        for name, tracker in trackers.items():
            tracks = tracker.update(dets)
            picture = draw_tracks(draw_frame(scene, frame), tracks, ["object"])
            cv2.putText(picture, name, (8, 24), cv2.FONT_HERSHEY_SIMPLEX, 0.7, (255, 255, 255), 2)
            drawn.append(picture)
        if frame >= scene.num_frames // 2 and frame % 10 == 0:
            cv2.imwrite(str(folder / f"{kind}_{frame:04d}.png"), np.concatenate(drawn, axis=1))


def main(argv=None) -> None:
    import motmetrics as mm  # the test extra: only this benchmark scores tracks

    args = make_parser().parse_args(argv)
    metrics = ["mota", "idf1", "num_switches", "num_false_positives", "num_misses"]
    rows = []
    track_seconds = []
    for kind in KINDS:
        accumulators = {name: [] for name in TRACKERS}
        for seed in range(args.videos):
            scene = make_scene(kind, seed, args.frames)
            detections = simulate_detections(scene, seed=1000 + seed)
            if args.save_frames and seed == 0:
                save_frames(Path(args.save_frames), kind, scene, detections)
            for name, make_tracker in TRACKERS.items():
                accumulators[name].append(mm.MOTAccumulator(auto_id=True))
                seconds = run_tracker(make_tracker, scene, detections, accumulators[name][-1])
                track_seconds.append((kind, name, seconds))
        host = mm.metrics.create()
        for name, accs in accumulators.items():
            overall = host.compute_many(accs, metrics=metrics, generate_overall=True).loc["OVERALL"]
            ms = 1000 * statistics.mean(
                s for k, n, run in track_seconds if (k, n) == (kind, name) for s in run
            )
            rows.append((kind, name, f"{overall['mota']:.3f}", f"{overall['idf1']:.3f}",
                         int(overall["num_switches"]), int(overall["num_false_positives"]),
                         int(overall["num_misses"]), f"{ms:.2f}"))  # fmt: skip
    frames = [draw_frame(make_scene("mixed", 0, args.detect_frames), f) for f in range(args.detect_frames)]
    detect = detection_ms(frames, args.tsize)
    ours = 1000 * statistics.mean(s for _, n, run in track_seconds if n == "ByteTrack (ours)" for s in run)
    logger.info(
        f"{len(KINDS)} kinds x {args.videos} videos x {args.frames} frames, {torch.get_num_threads()} threads"
    )
    print(tabulate(rows, headers=("video", "tracker", "MOTA", "IDF1", "ID switches", "FP", "misses",
                                  "track ms/frame")))  # fmt: skip
    print(
        f"detection (yolox-nano at {args.tsize}, batch 1, letterbox + forward + NMS): {detect:.1f} ms/frame; "
        f"ByteTrack's update {ours:.2f} ms/frame = {100 * ours / detect:.1f}% of it"
    )


if __name__ == "__main__":
    main()
