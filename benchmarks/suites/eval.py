"""COCO scoring time: pycocotools against faster-coco-eval on the same COCO-sized detections.

    python tools/benchmark.py eval                       # 5,000 images, ~7 boxes each, 100 detections each
    python tools/benchmark.py eval --images 500          # a quicker look

The case is generated in memory (no image files): 80 classes, boxes of COCO-like sizes (small,
medium and large), about 1% crowd boxes and 1% images without any object; per image 100 detections,
jittered copies of the ground truth with random scores plus false positives, one class never
detected. Each scorer runs `evaluators.scorer.coco_evaluate` (loading the results, evaluate,
accumulate, summarize: what tools/eval.py waits for) `--repeats` times; the best time is shown, and
the first faster-coco-eval call (which also indexes its copy of the ground truth) separately. The
twelve summary numbers of both are compared.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time
from typing import Any

import numpy as np
from pycocotools.coco import COCO
from tabulate import tabulate

from yolox_fast.evaluators.scorer import coco_evaluate, faster_coco_eval_available


def _box(rng: np.random.Generator, width: int, height: int) -> list[float]:
    # sides from 4 px to 400 px, log-uniform: COCO's mix of small, medium and large objects
    w, h = np.exp(rng.uniform(np.log(4), np.log(400), 2))
    w, h = min(w, width - 1), min(h, height - 1)
    return [float(rng.uniform(0, width - w)), float(rng.uniform(0, height - h)), float(w), float(h)]


def synthetic_coco_case(
    num_images: int = 5000,
    boxes_per_image: float = 7.0,
    dets_per_image: int = 100,
    num_classes: int = 80,
    crowd_fraction: float = 0.01,
    empty_fraction: float = 0.01,
    seed: int = 0,
) -> tuple[COCO, list[dict[str, Any]]]:
    """(ground truth as a pycocotools COCO, result records) of a generated COCO-like case.

    Category ids are 1, 3, 5, ... (not contiguous, as in COCO); the last category has ground truth but
    no detection; about `empty_fraction` of the images have no annotation; about `crowd_fraction` of
    the boxes are `iscrowd=1`. Detections: jittered copies of most ground-truth boxes (sometimes with
    the wrong class) and random boxes, `dets_per_image` per image in all, scores uniform in (0, 1).
    """
    rng = np.random.default_rng(seed)
    cat_ids = [2 * c + 1 for c in range(num_classes)]
    images, anns, records = [], [], []
    for img_id in range(1, num_images + 1):
        width, height = int(rng.integers(320, 641)), int(rng.integers(240, 481))
        images.append({"id": img_id, "width": width, "height": height, "file_name": f"{img_id:012d}.jpg"})
        count = 0 if rng.random() < empty_fraction else int(rng.poisson(boxes_per_image))
        dets = []
        for _ in range(count):
            box = _box(rng, width, height)
            cat = cat_ids[int(rng.integers(num_classes))]
            crowd = int(rng.random() < crowd_fraction)
            anns.append({"id": len(anns) + 1, "image_id": img_id, "category_id": cat, "bbox": box,
                         "area": box[2] * box[3], "iscrowd": crowd})  # fmt: skip
            if rng.random() < 0.8:
                jitter = rng.normal(0, 0.08, 4) * [box[2], box[3], box[2], box[3]]
                wrong = rng.random() < 0.1
                det_cat = cat_ids[int(rng.integers(num_classes))] if wrong else cat
                det_box = [box[0] + jitter[0], box[1] + jitter[1], max(box[2] + jitter[2], 1.0)]
                det_box.append(max(box[3] + jitter[3], 1.0))
                dets.append((det_box, det_cat))
        while len(dets) < dets_per_image:
            dets.append((_box(rng, width, height), cat_ids[int(rng.integers(num_classes))]))
        for det_box, det_cat in dets[:dets_per_image]:
            if det_cat != cat_ids[-1]:
                records.append({"image_id": img_id, "category_id": det_cat, "bbox": det_box, "score": 0.0})
    scores = rng.uniform(0.001, 1.0, len(records))
    for record, score in zip(records, scores):
        record["score"] = float(score)
    coco = COCO()
    coco.dataset = {
        "images": images,
        "categories": [{"id": c, "name": f"class{c}"} for c in cat_ids],
        "annotations": anns,
    }
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco, records


def main(argv=None) -> None:
    p = argparse.ArgumentParser("python tools/benchmark.py eval")
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--boxes", type=float, default=7.0, help="mean ground-truth boxes per image")
    p.add_argument("--dets", type=int, default=100, help="detections per image")
    p.add_argument("--classes", type=int, default=80)
    p.add_argument("--repeats", type=int, default=2, help="runs per scorer; the best is shown")
    args = p.parse_args(argv)
    if not faster_coco_eval_available():
        raise SystemExit(
            "faster-coco-eval is not installed (pip install faster-coco-eval): nothing to compare"
        )

    t0 = time.perf_counter()
    coco, records = synthetic_coco_case(args.images, args.boxes, args.dets, args.classes)
    img_ids = sorted(coco.getImgIds())
    print(
        f"case: {len(img_ids)} images, {len(coco.dataset['annotations'])} boxes "
        f"({sum(a['iscrowd'] for a in coco.dataset['annotations'])} crowd), {len(records)} detections, "
        f"{args.classes} classes (generated in {time.perf_counter() - t0:.1f} s)"
    )
    first_fast = coco_evaluate(coco, records, img_ids, "faster-coco-eval")
    times = {"pycocotools": [], "faster-coco-eval": []}
    stats = {}
    for _ in range(args.repeats):
        for name in times:
            score = coco_evaluate(coco, records, img_ids, name)
            times[name].append(score.seconds)
            stats[name] = score.stats
    base = min(times["pycocotools"])
    fast = min(times["faster-coco-eval"])
    rows = [(score_name, f"{min(t):.2f}", f"{base / min(t):.2f}x") for score_name, t in times.items()]
    rows.append(
        ("faster-coco-eval, first call", f"{first_fast.seconds:.2f}", f"{base / first_fast.seconds:.2f}x")
    )
    print(tabulate(rows, headers=("scorer", "seconds", "speed-up vs pycocotools")))
    diff = float(np.max(np.abs(stats["pycocotools"] - stats["faster-coco-eval"])))
    print(f"pycocotools {base:.2f} s, faster-coco-eval {fast:.2f} s: {base / fast:.1f}x faster")
    ap = stats["pycocotools"][0]
    print(f"largest difference of the twelve summary numbers: {diff:.2e} (AP50:95 {ap:.4f})")


if __name__ == "__main__":
    main()
