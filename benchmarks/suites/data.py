"""Benchmark: the training data pipeline (mosaic + MixUp + HSV + flip + letterbox), uncached vs ram vs disk.

    python tools/benchmark.py data                       # 416 and 640 px, 128 synthetic 640 px images
    python tools/benchmark.py data --sizes 640 --samples 100 --rounds 5

Throughput is samples/s of one process doing what one loader worker does (OpenCV single-threaded),
measured after a short warm-up, for each cache mode on the same images and sample seeds; the modes
take turns over several rounds (best round reported) so a busy machine's load hits them alike. The
ratio is against the uncached run of the same size. "ram"/"disk" build time is reported separately.

Memory: a TrainLoader with 4 persistent workers over the ram cache runs two epochs; from each
worker's /proc/<pid>/smaps the cache file's mapping gives RSS (what `top` would add up, counting the
shared pages in every worker) and PSS (each shared page split between the processes mapping it). The
sum of PSS is the cache's real footprint, counted once, printed beside the cache size.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import cv2
from tabulate import tabulate

from benchmarks.kit.measure import ratio
from yolox_fast.data import cache as cache_mod
from yolox_fast.data.augment import TrainTransform
from yolox_fast.data.build import build_train_loader
from yolox_fast.data.cache import build_cache
from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.datasets.synthetic import default_description, generate
from yolox_fast.data.mosaic import MosaicDetection
from yolox_fast.exp import Exp

MODES = ("uncached", "ram", "disk")


def _dataset(root: Path, size: int) -> COCODataset:
    return COCODataset(
        str(root), "train2017", "instances_train2017.json", img_size=(size, size), name="bench"
    )


def _mosaic(dataset, size: int, exp: Exp) -> MosaicDetection:
    box_filter = (exp.box_min_size, exp.box_min_area_ratio, exp.box_max_aspect)
    transform = TrainTransform(exp.max_labels, exp.flip_prob, exp.hsv_prob, box_filter)
    return MosaicDetection(
        dataset, (size, size), transform=transform, degrees=exp.degrees, translate=exp.translate,
        mosaic_scale=exp.mosaic_scale, mixup_scale=exp.mixup_scale, shear=exp.shear, enable_mixup=True,
        mosaic_prob=1.0, mixup_prob=1.0, box_filter=box_filter,
    )  # fmt: skip


def _throughput(
    mosaics: dict[str, MosaicDetection], samples: int, warmup: int, rounds: int
) -> dict[str, float]:
    """Best-of-`rounds` samples/s per mode; the modes take turns within each round, so load from other
    processes on a shared machine hits them alike. Every mode draws the same items."""
    n = len(next(iter(mosaics.values())))
    for mosaic in mosaics.values():
        for i in range(warmup):
            mosaic[(True, i % n, (0, i))]
    best = dict.fromkeys(mosaics, 0.0)
    for r in range(rounds):
        for mode, mosaic in mosaics.items():
            start = time.perf_counter()
            for i in range(samples):
                mosaic[(True, (r * samples + i) % n, (1, r * samples + i))]
            best[mode] = max(best[mode], samples / (time.perf_counter() - start))
    return best


def _smaps(pid: int, path: str) -> dict[str, int]:
    """Summed kB fields of `path`'s mappings in /proc/<pid>/smaps."""
    fields: dict[str, int] = {}
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            inside = line.endswith(path)
        elif inside and len(head) >= 3 and head[2] == "kB":
            fields[head[0].rstrip(":")] = fields.get(head[0].rstrip(":"), 0) + int(head[1])
    return fields


def _memory(config: Path, size: int, workers: int, batch: int) -> list[Sequence]:
    exp = Exp()
    exp.dataset, exp.num_classes, exp.input_size = str(config), 6, (size, size)
    exp.data_num_workers, exp.seed = workers, 0
    loader = build_train_loader(exp, batch, is_distributed=False, cache="ram")
    cache = loader.dataset.dataset.cache
    it = iter(loader)
    for _ in range(2 * len(loader)):
        next(it)
    pids = [w.pid for w in loader.loader._iterator._workers]
    per_worker = [_smaps(pid, str(cache.path)) for pid in pids]
    rss = sum(s.get("Rss", 0) for s in per_worker) / 1024
    pss = sum(s.get("Pss", 0) for s in per_worker) / 1024
    private = sum(s.get("Private_Clean", 0) + s.get("Private_Dirty", 0) for s in per_worker) / 1024
    cache.path.unlink(missing_ok=True)
    return [(f"{size}", f"{cache.nbytes / 2**20:.1f}", workers, f"{rss:.1f}", f"{pss:.1f}", f"{private:.1f}")]


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="benchmark.py data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[416, 640], help="training input sizes")
    parser.add_argument("--images", type=int, default=128, help="synthetic images in the set")
    parser.add_argument("--image-size", type=int, default=640, help="side of the synthetic images")
    parser.add_argument("--samples", type=int, default=60, help="timed samples per mode, size and round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds; the best round is reported")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4, help="loader workers for the memory measurement")
    parser.add_argument("--batch", type=int, default=8, help="batch size for the memory measurement")
    args = parser.parse_args(argv)

    cv2.setNumThreads(1)  # one loader worker's view: the loader's workers run OpenCV single-threaded
    work = Path(tempfile.mkdtemp(prefix="yolox_fast_bench_"))
    shm = Path(tempfile.mkdtemp(prefix="yolox_fast_bench_", dir=str(cache_mod.SHM_DIR)))
    cache_mod.SHM_DIR = shm  # private cache folders, removed at the end
    try:
        root = generate(
            default_description("coco", str(work / "shapes")),
            {"num_train": args.images, "num_val": 1, "size": args.image_size, "seed": 0},
        )
        exp = Exp()
        rows = []
        for size in args.sizes:
            mosaics, build_s = {}, {}
            for mode in MODES:
                dataset = _dataset(root, size)
                if mode != "uncached":
                    start = time.perf_counter()
                    dataset.attach_cache(
                        build_cache(dataset, mode, cache_dir=str(work / "disk_cache"), strict=True)
                    )
                    build_s[mode] = f"{time.perf_counter() - start:.2f}"
                mosaics[mode] = _mosaic(dataset, size, exp)
            rates = _throughput(mosaics, args.samples, args.warmup, args.rounds)
            for mosaic in mosaics.values():  # free /dev/shm before the next size
                if mosaic.dataset.cache is not None:
                    mosaic.dataset.cache.path.unlink()
            rows += [(size, mode, f"{rates[mode]:.1f}", ratio(rates[mode], rates["uncached"]),
                      build_s.get(mode, "-")) for mode in MODES]  # fmt: skip
        print(
            f"\nmosaic+mixup samples/s per worker ({args.images} synthetic {args.image_size} px JPEGs, "
            f"best of {args.rounds} rounds of {args.samples} samples)"
        )
        headers = ("size", "cache", "samples/s", "vs uncached", "build s")
        print(tabulate(rows, headers=headers, tablefmt="github"))
        mem_rows = []
        for size in args.sizes:
            mem_rows += _memory(root / "dataset.json", size, args.workers, args.batch)
        print(f"\nram cache memory with {args.workers} loader workers (two epochs read), MiB")
        headers = ("size", "cache size", "workers", "sum RSS of cache", "sum PSS of cache", "private copies")
        print(tabulate(mem_rows, headers=headers, tablefmt="github"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
