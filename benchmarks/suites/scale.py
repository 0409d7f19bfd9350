"""Benchmark: the data path at COCO's size, ours against official YOLOX 0.3.0 in the same run.

    $(tools/setup_yolox_reference.sh) tools/benchmark.py scale                      # N = 2k, 20k and 118k
    $(tools/setup_yolox_reference.sh) tools/benchmark.py scale --sizes 2000 20000 --iters 100
    python tools/benchmark.py scale --sides ours --sizes 500 --eval-images 200      # no official YOLOX

For each N it writes a COCO-scale train annotation file (`make_coco_set`: COCO's category frequencies, box
sizes, polygons and crowd boxes, the images hard links to a pool of a few JPEGs) and measures, each side in
fresh processes so one does not inherit the other's memory:

- start-up: the seconds and the resident memory that building the train dataset and its mosaic wrapper
  adds to a process (ours: the first start parses and saves the index, the second maps it);
- one loader worker: its USS growth after it reads every record (and a full gc), the copy-on-read growth;
- training loader: `--workers` workers serving `--iters` batches of `--batch` mosaic images at `--size`
  px: each worker's USS after 10 batches and at the end, and the PSS of the whole process tree;
- two ranks on one machine: the PSS the second adds to the first (ours shares the saved index);

and, on a generated 5,000-image val set, the evaluation: scoring plus report of the same detections (100,
300 and 2,100 per image) by our evaluator's scorer and by official's `COCOEvaluator.evaluate_prediction`,
seconds and the process's peak memory. Official at 2,100 detections per image holds about 12 GB of result
dicts: `--official-eval-max-dets` (default 300) skips it above that.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import msgspec
import numpy as np
import psutil
from tabulate import tabulate

from benchmarks.kit.measure import reset_rss_peak, status_kib

MIB = float(1 << 20)
PARTS = ("start", "worker", "loader", "ranks")
# instance counts of COCO train2017's 80 categories (in id order, approximately as published): the class
# frequencies of the generated sets (person 30%, toaster and hair drier under 0.03%)
COCO_COUNTS = (
    262465, 7113, 43867, 8725, 5135, 6069, 4571, 9973, 10759, 12884, 1865, 1983, 1285, 9838, 10806, 4768,
    5508, 6587, 9509, 8147, 5513, 1294, 5303, 5131, 8720, 11431, 12354, 6496, 6192, 2682, 6646, 2685, 6347,
    9076, 3276, 3747, 5543, 6126, 4812, 24342, 7913, 20650, 5479, 7770, 6165, 14358, 9458, 5851, 4373, 6399,
    7308, 7852, 2918, 5821, 7179, 6353, 38491, 5779, 8652, 4192, 15714, 4157, 5805, 4970, 2262, 5703, 2855,
    6434, 1673, 3334, 225, 5610, 2637, 24715, 6334, 6613, 1481, 4793, 198, 1954,
)  # fmt: skip
COCO_IDS = tuple(i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83))
BOXES_PER_IMAGE = 7.3  # COCO train2017: 860,001 boxes on 118,287 images
AREA_SHARES = (0.41, 0.34, 0.25)  # small (< 32^2), medium, large boxes in COCO
POOL_SIZES = ((640, 480), (480, 640), (640, 427), (427, 640), (640, 360), (500, 375), (612, 612), (640, 512))


# ------------------------------------------------------------------------------------------ inputs
def _pool(folder: Path, rng: np.random.Generator) -> list[tuple[Path, int, int]]:
    """A few smooth-noise JPEGs of COCO's common sizes: (path, width, height)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k, (w, h) in enumerate(POOL_SIZES):
        img = cv2.GaussianBlur(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), (0, 0), 6)
        path = folder / f"pool_{k}.jpg"
        cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        out.append((path, w, h))
    return out


def _annotation(rng, ann_id: int, img_id: int, w: int, h: int, cat: int, crowd: bool) -> dict[str, Any]:
    kind = rng.choice(3, p=AREA_SHARES)
    lo, hi = ((4, 32), (32, 96), (96, max(97, min(w, h))))[kind]
    side = float(rng.uniform(lo, hi))
    aspect = float(np.exp(rng.normal(0, 0.5)))
    bw, bh = float(min(side * np.sqrt(aspect), w - 1)), float(min(side / np.sqrt(aspect), h - 1))
    x, y = float(rng.uniform(0, w - bw)), float(rng.uniform(0, h - bh))
    if crowd:  # COCO's crowd regions carry an uncompressed RLE of their mask
        segmentation: Any = {
            "counts": rng.integers(0, 400, int(rng.integers(60, 400))).tolist(),
            "size": [h, w],
        }
    else:
        points = int(rng.integers(8, 40))
        angle = np.sort(rng.uniform(0, 2 * np.pi, points))
        px = x + bw / 2 * (1 + np.cos(angle))
        py = y + bh / 2 * (1 + np.sin(angle))
        segmentation = [np.round(np.column_stack([px, py]).ravel(), 2).tolist()]
    return {"segmentation": segmentation, "area": round(bw * bh * 0.6, 4), "iscrowd": int(crowd),
            "image_id": img_id, "bbox": [round(x, 2), round(y, 2), round(bw, 2), round(bh, 2)],
            "category_id": cat, "id": ann_id}  # fmt: skip


def make_coco_set(root: Path, split: str, n: int, seed: int = 0) -> Path:
    """`root/annotations/instances_<split>.json` of `n` images in `root/<split>/` (hard links to a pool of
    JPEGs, copies where links fail), COCO's per-image fields, ~7.3 boxes per image drawn with COCO's
    category frequencies and area shares, a polygon per box and 1% crowd boxes with an RLE. Returns the
    annotation file's path."""
    rng = np.random.default_rng(seed)
    pool = _pool(root / "pool", rng)
    images_dir = root / split
    images_dir.mkdir(parents=True, exist_ok=True)
    weights = np.asarray(COCO_COUNTS, dtype=np.float64) / sum(COCO_COUNTS)
    images, anns = [], []
    for img_id in range(1, n + 1):
        src, w, h = pool[int(rng.integers(len(pool)))]
        name = f"{img_id:012d}.jpg"
        target = images_dir / name
        if not target.exists():
            try:
                os.link(src, target)
            except OSError:
                shutil.copyfile(src, target)
        images.append({"license": 1, "file_name": name, "coco_url": f"http://images.cocodataset.org/{split}/{name}",
                       "height": h, "width": w, "date_captured": "2013-11-14 11:18:45",
                       "flickr_url": f"http://farm4.staticflickr.com/{img_id}.jpg",
                       "id": img_id})  # fmt: skip
        for cat in rng.choice(len(COCO_IDS), size=int(rng.poisson(BOXES_PER_IMAGE)), p=weights):
            anns.append(_annotation(rng, len(anns) + 1, img_id, w, h, COCO_IDS[cat], rng.random() < 0.01))
    cats = [{"supercategory": "thing", "id": i, "name": f"class_{i}"} for i in COCO_IDS]
    data = {"info": {"description": "generated"}, "licenses": [], "images": images, "annotations": anns,
            "categories": cats}  # fmt: skip
    path = root / "annotations" / f"instances_{split}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(data))
    return path


def fake_detections(coco_gt, per_image: int, seed: int = 0) -> dict[int, np.ndarray]:
    """Per val image, `per_image` detections (K, 6) [x1, y1, x2, y2, score, class index]: its boxes
    jittered, then random boxes of random classes, scores in (0, 1)."""
    rng = np.random.default_rng(seed)
    cat_index = {c: i for i, c in enumerate(sorted(coco_gt.getCatIds()))}
    out = {}
    for img_id in sorted(coco_gt.getImgIds()):
        info = coco_gt.imgs[img_id]
        anns = coco_gt.imgToAnns.get(img_id, [])[:per_image]
        dets = np.empty((per_image, 6))
        w, h = info["width"], info["height"]
        xy = rng.uniform(0, [w * 0.9, h * 0.9], size=(per_image, 2))
        dets[:, :2] = xy
        dets[:, 2:4] = xy + rng.uniform(4, 200, size=(per_image, 2))
        dets[:, 4] = rng.random(per_image)
        dets[:, 5] = rng.integers(0, len(cat_index), per_image)
        for k, a in enumerate(anns):
            x, y, bw, bh = a["bbox"]
            jitter = rng.normal(0, 0.05 * max(bw, bh, 1), 4)
            dets[k, :4] = [x + jitter[0], y + jitter[1], x + bw + jitter[2], y + bh + jitter[3]]
            dets[k, 4], dets[k, 5] = 0.5 + rng.random() / 2, cat_index[a["category_id"]]
        out[img_id] = dets
    return out


# ------------------------------------------------------------------------------------------ measuring
def _rss() -> int:
    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    """The process's peak resident size in bytes since `reset_rss_peak` (a child starts with its parent's,
    here the generator's peak: reset it first)."""
    return status_kib("VmHWM:") * 1024


def _tree_pss(pid: int) -> int:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(p.memory_full_info().pss for p in procs)


def _in_child(fn: Callable[..., dict], *args) -> dict:
    """`fn(*args)` in a fresh spawned process (its imports, nothing inherited); its returned dict."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_child_main, args=(fn, args, theirs))
    child.start()
    result = ours.recv()
    child.join()
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def _child_main(fn, args, conn) -> None:
    try:
        conn.send(fn(*args))
    except Exception as err:  # noqa: BLE001 -- reported to the parent, which raises it
        conn.send({"error": f"{type(err).__name__}: {err}"})
    conn.close()


def _build(side: str, root: str, size: int, index_dir: str):
    """(the train dataset, its mosaic wrapper) as each side's training builds them."""
    if side == "ours":
        from yolox_fast.data.augment import TrainTransform as OurTransform
        from yolox_fast.data.datasets.coco import COCODataset as OurDataset
        from yolox_fast.data.mosaic import MosaicDetection as OurMosaic

        ds = OurDataset(
            root, "train2017", "instances_train2017.json", img_size=(size, size), index_dir=index_dir
        )
        return ds, OurMosaic(ds, (size, size), transform=OurTransform())
    from yolox.data import COCODataset, MosaicDetection, TrainTransform

    ann, transform = "instances_train2017.json", TrainTransform(max_labels=50)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' progress lines
        ds = COCODataset(
            data_dir=root, json_file=ann, name="train2017", img_size=(size, size), preproc=transform
        )
    return ds, MosaicDetection(ds, img_size=(size, size), mosaic=True, preproc=TrainTransform(max_labels=120))


def _import_side(side: str) -> None:
    if side == "ours":
        import yolox_fast.data.mosaic  # noqa: F401
    else:
        import yolox.data  # noqa: F401


def measure_start(side: str, root: str, size: int, index_dir: str) -> dict:
    """Seconds and resident MiB that building the train dataset + mosaic adds to a fresh process."""
    _import_side(side)
    gc.collect()
    before = _rss()
    reset_rss_peak()
    t0 = time.perf_counter()
    dataset, _ = _build(side, root, size, index_dir)
    seconds = time.perf_counter() - t0
    gc.collect()
    return {
        "seconds": seconds,
        "added_mib": (_rss() - before) / MIB,
        "peak_mib": (_peak_rss() - before) / MIB,
    }


def _read_all_records(side: str, dataset, conn) -> None:
    """In a forked worker: USS growth after reading every record, and after a full gc then."""
    before = psutil.Process().memory_full_info().uss
    for i in range(len(dataset)):
        if side == "ours":
            dataset.load_anno(i)
            dataset.resized_size(i)
        else:
            dataset.load_anno(i)
            dataset.annotations[i][2]  # noqa: B018 -- what its mosaic reads: the resized size
    touched = psutil.Process().memory_full_info().uss
    gc.collect()
    collected = psutil.Process().memory_full_info().uss
    conn.send(((touched - before) / MIB, (collected - before) / MIB))
    conn.close()


def measure_worker(side: str, root: str, size: int, index_dir: str) -> dict:
    """A forked worker's USS growth reading every record (the copy-on-read of per-image objects)."""
    dataset, _ = _build(side, root, size, index_dir)
    if side == "ours":
        for array in dataset.index.arrays.values():  # as the main process has: the pages are shared
            np.asarray(array).sum()
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_read_all_records, args=(side, dataset, theirs))
    child.start()
    touched, collected = ours.recv()
    child.join()
    return {"touched_mib": touched, "gc_mib": collected}


def _loader(side: str, root: str, size: int, batch: int, workers: int, index_dir: str):
    if side == "ours":
        from yolox_fast.data.build import build_train_loader
        from yolox_fast.exp import Exp

        split = {"images": "train2017", "ann": "instances_train2017.json"}
        description = {"name": "scale", "format": "coco", "root": root, "train": split, "val": split}
        description["class_names"] = [f"class_{i}" for i in COCO_IDS]
        Path(index_dir).mkdir(parents=True, exist_ok=True)
        (Path(index_dir) / "scale.json").write_bytes(msgspec.json.encode(description))
        exp = Exp()
        exp.dataset, exp.input_size, exp.num_classes = str(Path(index_dir) / "scale.json"), (size, size), 80
        exp.data_num_workers, exp.cache_dir, exp.seed = workers, index_dir, 0
        return iter(build_train_loader(exp, batch, is_distributed=False))
    from yolox.exp import get_exp

    exp = get_exp(None, "yolox-nano")
    exp.data_dir, exp.train_ann, exp.input_size = root, "instances_train2017.json", (size, size)
    exp.data_num_workers, exp.seed = workers, 0
    return iter(exp.get_data_loader(batch_size=batch, is_distributed=False, no_aug=False, cache_img=None))


def measure_loader(
    side: str, root: str, size: int, batch: int, workers: int, iters: int, index_dir: str
) -> dict:
    """Each loader worker's USS after 10 batches and after `iters`, and the process tree's PSS then."""
    batches = _loader(side, root, size, batch, workers, index_dir)
    me = psutil.Process()

    def worker_uss() -> list[float]:
        return [p.memory_full_info().uss / MIB for p in me.children(recursive=True)]

    early = []
    for it in range(iters):
        next(batches)
        if it == 9:
            early = worker_uss()
    late = worker_uss()
    tree = _tree_pss(os.getpid()) / MIB
    del batches  # the workers end here, before the process does
    gc.collect()
    return {"early": early, "late": late, "tree_pss_mib": tree}


def _hold_dataset(side: str, root: str, size: int, index_dir: str, ready, start, built, done) -> None:
    _import_side(side)
    ready.set()
    start.wait()
    held = _build(side, root, size, index_dir)  # kept until measured, as a rank keeps its dataset
    gc.collect()
    built.set()
    done.wait()
    del held


def measure_ranks(side: str, root: str, size: int, index_dir: str, ranks: int) -> dict:
    """PSS of `ranks` processes of one machine that each built the dataset (started together), against
    the same processes' PSS before the build."""
    ctx = mp.get_context("spawn")
    start, done = ctx.Event(), ctx.Event()
    ready, built = [ctx.Event() for _ in range(ranks)], [ctx.Event() for _ in range(ranks)]
    procs = [
        ctx.Process(target=_hold_dataset, args=(side, root, size, index_dir, r, start, b, done))
        for r, b in zip(ready, built)
    ]
    for p in procs:
        p.start()
    for r in ready:
        r.wait()
    before = sum(psutil.Process(p.pid).memory_full_info().pss for p in procs)
    start.set()
    for b in built:
        b.wait()
    after = sum(psutil.Process(p.pid).memory_full_info().pss for p in procs)
    done.set()
    for p in procs:
        p.join()
    return {"added_pss_mib": (after - before) / MIB}


def measure_eval(side: str, root: str, per_image: int, index_dir: str) -> dict:
    """Seconds and peak MiB (over the process's resident memory before) of scoring the generated
    detections and writing the summary, from the val dataset's construction on."""
    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):
        gt_for_dets = COCO(str(Path(root) / "annotations" / "instances_val2017.json"))
    detections = fake_detections(gt_for_dets, per_image)
    del gt_for_dets
    if side == "ours":
        import faster_coco_eval  # noqa: F401 -- loaded before the figures, as in a trainer

        from yolox_fast.data.datasets.coco import COCODataset as OurDataset
        from yolox_fast.evaluators.coco import coco_score
        from yolox_fast.evaluators.detection_evaluator import top_per_class
        from yolox_fast.evaluators.scorer import COCO_MAX_DETS
    else:
        from types import SimpleNamespace

        import torch
        from yolox.data import COCODataset, ValTransform
        from yolox.evaluators import COCOEvaluator
    gc.collect()
    before = _rss()
    reset_rss_peak()
    t0 = time.perf_counter()
    if side == "ours":
        ds = OurDataset(root, "val2017", "instances_val2017.json", for_eval=True, index_dir=index_dir)
        capped = {i: top_per_class(d, COCO_MAX_DETS) for i, d in detections.items()}  # as run_inference
        ap = coco_score(ds.coco, capped, ds.class_ids, ds.class_names)["ap50_95"]
    else:
        with contextlib.redirect_stdout(io.StringIO()):
            ds = COCODataset(root, json_file="instances_val2017.json", name="val2017", preproc=ValTransform())
        loader = SimpleNamespace(dataset=ds, batch_size=1)
        evaluator = COCOEvaluator(loader, img_size=(640, 640), confthre=0.001, nmsthre=0.65, num_classes=80)
        records = [  # what its convert_to_coco_format makes of the same boxes
            {
                "image_id": int(i),
                "category_id": ds.class_ids[int(c)],
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "score": s,
                "segmentation": [],
            }
            for i, dets in detections.items()
            for x1, y1, x2, y2, s, c in dets.tolist()
        ]
        with contextlib.redirect_stdout(io.StringIO()):
            ap = float(evaluator.evaluate_prediction(records, torch.tensor([0.0, 0.0, 1.0]))[0])
    return {"seconds": time.perf_counter() - t0, "peak_mib": (_peak_rss() - before) / MIB, "ap": ap}


# ------------------------------------------------------------------------------------------ running
def _sides(args) -> list[str]:
    sides = args.sides.split(",")
    if "official" in sides:
        from benchmarks.kit.official import require_official_yolox

        require_official_yolox("scale")
    return sides


def run_size(args, n: int, sides: list[str], work: Path) -> list[list]:
    """The rows of one N."""
    root = work / f"n{n}"
    t0 = time.perf_counter()
    ann = make_coco_set(root, "train2017", n, seed=n)
    print(
        f"N={n}: {ann.stat().st_size / MIB:.0f} MiB train json written in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    rows = []
    index_dir = str(root / "cache")
    for side in sides:
        row = [f"{n:,} {side}"]
        if "start" in args.parts:
            first = _in_child(measure_start, side, str(root), args.size, index_dir)
            row += [f"{first['seconds']:.1f}", f"{first['added_mib']:.0f}", f"{first['peak_mib']:.0f}"]
            if side == "ours":
                again = _in_child(measure_start, side, str(root), args.size, index_dir)
                row.append(f"{again['seconds']:.2f} s, +{again['added_mib']:.0f} MiB")
            else:
                row.append("(parses again)")
        else:
            row += ["-"] * 4
        if "worker" in args.parts:
            worker = _in_child(measure_worker, side, str(root), args.size, index_dir)
            row.append(f"{worker['touched_mib']:.1f} / {worker['gc_mib']:.1f}")
        else:
            row.append("-")
        if "loader" in args.parts and args.iters > 10:
            loader = _in_child(
                measure_loader, side, str(root), args.size, args.batch, args.workers, args.iters, index_dir
            )
            growth = [late - early for early, late in zip(loader["early"], loader["late"])]
            row += [f"{max(growth):.1f}" if growth else "-", f"{loader['tree_pss_mib']:.0f}"]
        else:
            row += ["-", "-"]
        if "ranks" in args.parts:
            if side == "ours":  # the ranks of a run after the first: the index is saved (the first parses)
                _in_child(measure_start, side, str(root), args.size, index_dir)
            one = _in_child(measure_ranks, side, str(root), args.size, index_dir, 1)
            two = _in_child(measure_ranks, side, str(root), args.size, index_dir, 2)
            row.append(f"{one['added_pss_mib']:.0f} / {two['added_pss_mib']:.0f}")
        else:
            row.append("-")
        rows.append(row)
        print(tabulate([row], tablefmt="plain"), flush=True)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def run_eval(args, sides: list[str], work: Path) -> list[list]:
    root = work / "val"
    make_coco_set(root, "val2017", args.eval_images, seed=1)
    rows = []
    for per_image in args.eval_dets:
        for side in sides:
            if side == "official" and per_image > args.official_eval_max_dets:
                rows.append([f"{per_image} {side}", "skipped (--official-eval-max-dets)", "", ""])
                continue
            r = _in_child(measure_eval, side, str(root), per_image, str(root / "cache"))
            rows.append(
                [f"{per_image} {side}", f"{r['seconds']:.1f}", f"{r['peak_mib']:.0f}", f"{r['ap']:.5f}"]
            )
            print(tabulate([rows[-1]], tablefmt="plain"), flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser("python tools/benchmark.py scale")
    p.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000, 118287], help="train images N")
    p.add_argument("--sides", default="ours,official", help="ours, official or both (comma-separated)")
    p.add_argument("--size", type=int, default=320, help="input size (px) of the datasets and the loader")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--iters", type=int, default=100, help="loader batches (more than 10)")
    p.add_argument(
        "--parts",
        nargs="+",
        default=list(PARTS),
        choices=PARTS,
        help="the train-set measurements to make (the evaluation's: --eval-dets)",
    )
    p.add_argument("--eval-images", type=int, default=5000)
    p.add_argument("--eval-dets", type=int, nargs="*", default=[100, 300, 2100], help="detections per image")
    p.add_argument("--official-eval-max-dets", type=int, default=300)
    p.add_argument("--work", default=None, help="folder for the generated sets (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the generated sets")
    args = p.parse_args(argv)
    sides = _sides(args)
    work = Path(args.work or tempfile.mkdtemp(prefix="yolox_fast_scale_"))
    rows = [row for n in args.sizes for row in run_size(args, n, sides, work)]
    print()
    print(tabulate(rows, headers=(
        "N, side", "start s", "+RSS MiB", "+peak MiB", "second start", "worker USS +MiB read all / gc",
        f"worker USS +MiB, {args.iters} vs 10 batches", "tree PSS MiB", "+PSS MiB 1 / 2 ranks")))  # fmt: skip
    if args.eval_dets:
        eval_rows = run_eval(args, sides, work)
        print()
        print(f"evaluation, {args.eval_images} images (scoring + summary of the same detections):")
        print(tabulate(eval_rows, headers=("dets/image, side", "seconds", "peak +MiB", "AP50:95")))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
