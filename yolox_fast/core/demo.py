"""The demo's loops: images (files, folders, globs, URLs) or frames (video files, streams, a webcam), B at a
time through a Predictor; what they read is `core.sources`."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from loguru import logger

from yolox_fast.core.prediction_outputs import (
    OutputOptions,
    PredictionWriter,
    select_detections,
    summary_line,
)
from yolox_fast.core.sources import IMAGE_EXTS, VideoSource, image_base, image_name, list_images, read_image
from yolox_fast.inference import Predictor
from yolox_fast.tracking import ByteTracker, mot_lines
from yolox_fast.utils.visualize import draw_detections, draw_tracks

# a picture's defaults, YOLOX's demo's: score >= 0.3, then NMS at IoU 0.3 across classes
DEMO_CONF = 0.3
DEMO_NMS = 0.3


def detections_to_records(dets: np.ndarray, class_names: Sequence[str]) -> list[dict[str, Any]]:
    """(K, 6) detections -> [{"bbox": [x1, y1, x2, y2], "score", "class_id", "class_name"}] (original px)."""
    return [
        {
            "bbox": [round(v, 2) for v in (x1, y1, x2, y2)],
            "score": round(score, 5),
            "class_id": int(cls),
            "class_name": class_names[int(cls)] if int(cls) < len(class_names) else str(int(cls)),
        }
        for x1, y1, x2, y2, score, cls in dets.tolist()
    ]


def _read_batches(
    paths: Sequence[Path | str], batch_size: int
) -> Iterator[tuple[list[Path | str], list[np.ndarray]]]:
    """Batches of up to `batch_size` decoded images; an unreadable file is reported and left out."""
    names: list[Path | str] = []
    images: list[np.ndarray] = []
    for path in paths:
        img = read_image(path)  # decoded as training and evaluation decode; None: said and skipped
        if img is None:
            continue
        names.append(path)
        images.append(img)
        if len(images) == batch_size:
            yield names, images
            names, images = [], []
    if images:
        yield names, images


def run_on_images(
    predictor: Predictor,
    path: str,
    batch_size: int,
    class_names: Sequence[str],
    out_dir: Path | None = None,
    save_images: bool = False,
    save_json: bool = False,
    outputs: OutputOptions | None = None,
    recursive: bool = False,
    paths: Sequence[Path | str] | None = None,
) -> dict[str, np.ndarray]:
    """Detect on every image at `path` (file, folder, glob or image URL: `sources.list_images`; a folder's
    subfolders too with `recursive`), `batch_size` images per forward. `paths`: those images when the caller
    has listed them already (the demo, which counts them before compiling), so they are not listed twice.

    Returns {path relative to `path`: (K, 6) detections}. `save_images`: annotated copies under
    `out_dir` (same relative layout); `save_json`: `out_dir/detections.json`; `outputs`: the class filter,
    the per-image cap and the label files (`prediction_outputs`), applied to everything above.
    Logs one summary line per image, images/s (end to end) and the model's own images/s (forward + NMS).
    """
    outputs = outputs or OutputOptions()
    if (save_images or save_json or outputs.writes) and out_dir is None:
        raise ValueError("saving images, JSON or labels needs an out_dir")
    writer = PredictionWriter(out_dir, class_names, outputs) if outputs.writes else None
    paths = list_images(path, recursive) if paths is None else paths
    if not paths:
        raise FileNotFoundError(f"no images ({', '.join(IMAGE_EXTS)}) under {path}")
    base = image_base(path)
    results: dict[str, np.ndarray] = {}
    start = time.perf_counter()
    for names, images in _read_batches(paths, batch_size):
        batch_start = time.perf_counter()
        predicted = predictor.predict(images)
        ms = 1000 * (time.perf_counter() - batch_start) / len(images)
        for name, img, dets in zip(names, images, predicted):
            rel = image_name(name, base)
            dets = select_detections(dets, outputs.classes, outputs.max_det)
            results[rel] = dets
            logger.info(summary_line(rel, dets, class_names, ms))
            if writer is not None:
                writer.add(rel, img, dets)
            if save_images:
                out = out_dir / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                cv2.imwrite(str(out), draw_detections(img, dets, class_names, predictor.conf))
    elapsed = time.perf_counter() - start
    if writer is not None:
        writer.close()
        logger.info(f"labels / crops written under {out_dir}")
    skipped = len(paths) - len(results)
    logger.info(
        f"{len(results)} images ({skipped} unreadable, skipped) in {elapsed:.2f} s: "
        f"{len(results) / max(elapsed, 1e-9):.1f} images/s end to end, "
        f"{predictor.num_images / max(predictor.forward_s + predictor.nms_s, 1e-9):.1f} images/s model "
        f"(batch {batch_size})"
    )
    if save_json:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "detections.json", "w") as f:
            json.dump({k: detections_to_records(v, class_names) for k, v in results.items()}, f, indent=1)
        logger.info(f"detections written to {out_dir / 'detections.json'}")
    if save_images and results:
        logger.info(f"annotated images under {out_dir}")
    return results


def run_on_stream(
    predictor: Predictor,
    source: str | int,
    batch_size: int,
    class_names: Sequence[str],
    out_path: Path | None = None,
    save_video: bool = False,
    save_json: bool = False,
    show: bool = False,
    tracker: ByteTracker | None = None,
    outputs: OutputOptions | None = None,
) -> int:
    """Detect on a video file, a stream URL or a camera id (`sources.VideoSource`: a dropped live stream is
    reopened), `batch_size` frames per forward; returns frames processed.

    `save_video`: annotated `out_path` (.mp4); `save_json`: detections per frame in `out_path` with a
    .json suffix; `show` opens a window (ESC or q stops). `tracker`: each frame's detections go through it
    (the predictor's threshold should be the tracker's low one), its tracks are drawn with their ids and
    written in MOT Challenge text format to `out_path` with a .txt suffix. `outputs`: its class filter and
    per-frame cap (label files are for images). One summary line per frame. Where no window can open
    (`window_unavailable`) the run says why in one line and writes the annotated video to `out_path` instead.
    """
    if show:
        reason = window_unavailable()
        if reason is not None:
            show = False
            save_video = save_video or out_path is not None
            where = f"the annotated video is written to {out_path}" if save_video else "nothing is shown"
            logger.warning(f"frames are not shown: {reason}; {where}")
    if (save_video or save_json or tracker) and out_path is None:
        raise ValueError("saving the video, JSON or tracks needs an out_path")
    outputs = outputs or OutputOptions()
    video = VideoSource(source)
    fps = video.fps
    writer = None
    per_frame: list[list[dict[str, Any]]] = []
    track_lines: list[str] = []
    frames_done = 0
    stop = False
    start = time.perf_counter()
    try:
        while not stop:
            frames = []
            while len(frames) < batch_size:
                frame = video.read()
                if frame is None:
                    break
                frames.append(frame)
            if not frames:
                break
            batch_start = time.perf_counter()
            predicted = predictor.predict(frames)
            ms = 1000 * (time.perf_counter() - batch_start) / len(frames)
            for k, (frame, dets) in enumerate(zip(frames, predicted)):
                dets = select_detections(dets, outputs.classes, outputs.max_det)
                logger.info(summary_line(f"frame {frames_done + k + 1}", dets, class_names, ms))
                if tracker is None:
                    drawn = draw_detections(frame, dets, class_names, predictor.conf)
                else:
                    tracks = tracker.update(dets)  # (T, 7) x1, y1, x2, y2, id, score, class
                    track_lines += mot_lines(tracker.frame, tracks)
                    drawn = draw_tracks(frame, tracks, class_names)
                if save_video:
                    if writer is None:
                        out_path.parent.mkdir(parents=True, exist_ok=True)
                        h, w = frame.shape[:2]
                        writer = cv2.VideoWriter(str(out_path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
                    writer.write(drawn)
                if save_json:
                    per_frame.append(detections_to_records(dets, class_names))
                if show and not stop:
                    shown = _show(drawn)
                    stop, show = shown is None, bool(shown)
            frames_done += len(frames)
            stop = stop or len(frames) < batch_size
    except KeyboardInterrupt:
        logger.info("interrupted")
    finally:
        video.release()
        if writer is not None:
            writer.release()
        elapsed = time.perf_counter() - start
        fps_done = frames_done / max(elapsed, 1e-9)
        logger.info(f"{frames_done} frames in {elapsed:.2f} s: {fps_done:.1f} frames/s")
        if writer is not None:
            logger.info(f"annotated video written to {out_path}")
        if save_json:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            with open(out_path.with_suffix(".json"), "w") as f:
                json.dump(per_frame, f)
            logger.info(f"detections per frame written to {out_path.with_suffix('.json')}")
        if tracker is not None:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.with_suffix(".txt").write_text("".join(line + "\n" for line in track_lines))
            ids = len({line.split(",")[1] for line in track_lines})
            logger.info(
                f"{ids} tracks, {len(track_lines)} boxes, written to {out_path.with_suffix('.txt')} (MOT)"
            )
    return frames_done


def window_unavailable() -> str | None:
    """Why frames cannot be shown in a window here, None when they can: an OpenCV build without a GUI
    (opencv-python-headless), or no display to open one on (OpenCV's Qt would abort the process)."""
    gui = re.search(r"^\s*GUI:\s*(\S+)", cv2.getBuildInformation(), re.MULTILINE)
    if gui and gui.group(1).upper() == "NONE":
        return "this OpenCV build has no GUI (opencv-python-headless; opencv-python has one)"
    if sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    ):
        return "there is no display to open a window on (DISPLAY is not set)"
    return None


def _show(frame: np.ndarray) -> bool | None:
    """Display `frame`: True to go on, False if the window cannot open (said once), None if ESC/q."""
    try:
        cv2.imshow("yolox_fast demo", frame)
        key = cv2.waitKey(1) & 0xFF
    except cv2.error as err:
        logger.warning(f"frames are not shown: OpenCV cannot open a window ({str(err).strip()[:120]})")
        return False
    return None if key in (27, ord("q")) else True


def write_demo_image(predictor: Predictor, image: np.ndarray, class_names: Sequence[str], path: str) -> int:
    """Draw `predictor`'s detections on one BGR image and write it to `path`; returns how many were drawn."""
    dets = predictor.predict([image])[0]
    cv2.imwrite(path, draw_detections(image, dets, class_names))
    logger.info(f"demo: {len(dets)} detections drawn to {path}")
    return len(dets)


def timestamped_dir(root: str, exp_name: str) -> Path:
    """<root>/<exp_name>/vis_res/<YYYY_MM_DD_HH_MM_SS>, as YOLOX's demo."""
    return Path(root) / exp_name / "vis_res" / time.strftime("%Y_%m_%d_%H_%M_%S", time.localtime())
