"""(e, statistical part) What the model sees: official YOLOX 0.3.0's MosaicDetection + TrainTransform
against yolox_fast's (built by `exp.get_data_loader`), on the same generated images, same settings.

For every training sample both pipelines are watched from outside (their own code runs unchanged): the
mosaic placement and the affine matrix each draws are recorded as they are computed, and every source
box carries a tag in its class column, so each output box is traced to the box it came from. From that:

- boxes per image; box sizes (share with min side under 8 / 4 px, at most 2 px; quantiles of the min
  side and of sqrt(area)), at the network input;
- for mosaic samples: how much of each kept box is visible (its output area over the area of the whole
  source box warped by the same matrix), and, over every source box that is visible at all, which share
  each pipeline keeps, by visible fraction;
- the share of mosaic samples whose mosaic centre (where the 4 tiles meet) lands in the output, and the
  share of the output covered by the tiles, and by the sample's own image (tile 0).

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/data_stats.py [--samples 300] ...
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import tempfile
from pathlib import Path

import common
import cv2
import numpy as np

TAG = 1000  # class column = pull number * TAG + box index


@contextlib.contextmanager
def recording(module, name: str, log: list):
    """Replace module.name by a wrapper that appends (args, result) to `log`; restored on exit."""
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        log.append((args, kwargs, result))
        return result

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)


class Watch:
    """The calls one pipeline made: pulled images (index, boxes), tile placements, affine matrices."""

    def __init__(self, dataset) -> None:
        self.pulls: list[np.ndarray] = []
        self.placements: list = []
        self.matrices: list = []
        original = dataset.pull_item

        def tagged(index, **kwargs):  # ours passes with_image (a mosaic tile it does not decode)
            img, labels, info, img_id = original(index, **kwargs)
            labels = np.array(labels, dtype=np.float64, copy=True)
            self.pulls.append(labels[:, :4].copy())
            labels[:, 4] = (len(self.pulls) - 1) * TAG + np.arange(len(labels))
            return img, labels, info, img_id

        dataset.pull_item = tagged  # this instance only

    def mark(self) -> tuple[int, int, int]:
        return len(self.pulls), len(self.placements), len(self.matrices)


def warp_hull(boxes: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    corners = boxes[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 4, 2)
    mapped = corners @ matrix[:, :2].T + matrix[:, 2]
    return np.concatenate([mapped.min(1), mapped.max(1)], 1)


def clip(boxes: np.ndarray, w: float, h: float) -> np.ndarray:
    out = boxes.copy()
    out[:, [0, 2]] = out[:, [0, 2]].clip(0, w)
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, h)
    return out


def area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)


def analyse(labels: np.ndarray, watch: Watch, start: tuple[int, int, int], size: tuple[int, int]) -> dict:
    """One sample: output labels (K, 5) [tag, cx, cy, w, h] and the calls made while producing it."""
    p0, l0, m0 = start
    out_h, out_w = size
    tags = labels[:, 0].round().astype(np.int64)
    rec = {"mosaic": len(watch.placements) > l0, "wh": labels[:, 3:5].copy()}
    if not rec["mosaic"]:
        return rec
    placements = watch.placements[l0:]  # 4 calls: (k, xc, yc, w, h, input_h, input_w) -> (big, small)
    matrix = np.asarray(watch.matrices[m0][2], dtype=np.float64)[:2]
    canvas_h, canvas_w = 2 * out_h, 2 * out_w
    full, visible_geo, source_tags = [], [], []
    cover = np.zeros((canvas_h, canvas_w), np.uint8)
    for k, (args, _, (big, small)) in enumerate(placements):
        boxes = watch.pulls[p0 + k] + np.array([big[0] - small[0], big[1] - small[1]] * 2, dtype=np.float64)
        cover[big[1] : big[3], big[0] : big[2]] = k + 1
        full.append(warp_hull(boxes, matrix))
        visible_geo.append(clip(warp_hull(clip(boxes, canvas_w, canvas_h), matrix), out_w, out_h))
        source_tags.append((p0 + k) * TAG + np.arange(len(boxes)))
    full, visible_geo = np.concatenate(full), np.concatenate(visible_geo)
    source_tags = np.concatenate(source_tags)
    full_area = area(full)
    index_of_tag = {int(t): i for i, t in enumerate(source_tags)}
    rows = [index_of_tag[int(t)] for t in tags]
    rec["visible_fraction"] = labels[:, 3] * labels[:, 4] / np.maximum(full_area[rows], 1e-9)
    geo_min_side = np.minimum(visible_geo[:, 2] - visible_geo[:, 0], visible_geo[:, 3] - visible_geo[:, 1])
    seen = geo_min_side > 0
    kept = np.isin(source_tags, tags)
    rec["candidate_fraction"] = (area(visible_geo) / np.maximum(full_area, 1e-9))[seen]
    rec["candidate_min_side"] = geo_min_side[seen]
    rec["candidate_kept"] = kept[seen]
    (_, xc, yc, *_), _, _ = placements[0]
    cx, cy = matrix @ np.array([xc, yc, 1.0])
    rec["centre_visible"] = bool(0 <= cx < out_w and 0 <= cy < out_h)
    warped = cv2.warpAffine(cover, matrix, (out_w, out_h), flags=cv2.INTER_NEAREST, borderValue=0)
    rec["tile_cover"] = float((warped > 0).mean())
    rec["primary_cover"] = float((warped == 1).mean())
    return rec


def quantiles(x: np.ndarray, qs=(0.05, 0.25, 0.5)) -> dict:
    return {f"q{int(q * 100)}": float(np.quantile(x, q)) if len(x) else None for q in qs}


def summarise(records: list[dict]) -> dict:
    wh = np.concatenate([r["wh"] for r in records]) if records else np.zeros((0, 2))
    min_side = wh.min(1)
    sqrt_area = np.sqrt(np.clip(wh[:, 0] * wh[:, 1], 0, None))
    mos = [r for r in records if r["mosaic"]]
    vis = np.concatenate([r["visible_fraction"] for r in mos]) if mos else np.zeros(0)
    cand = np.concatenate([r["candidate_fraction"] for r in mos]) if mos else np.zeros(0)
    cand_side = np.concatenate([r["candidate_min_side"] for r in mos]) if mos else np.zeros(0)
    kept = np.concatenate([r["candidate_kept"] for r in mos]) if mos else np.zeros(0, bool)

    def kept_share(mask):
        return float(kept[mask].mean()) if mask.any() else None

    return {
        "samples": len(records),
        "mosaic_samples": len(mos),
        "boxes": int(len(wh)),
        "boxes_per_image": float(len(wh) / max(len(records), 1)),
        "boxes_per_mosaic_image": float(sum(len(r["wh"]) for r in mos) / max(len(mos), 1)),
        "boxes_per_plain_image": float(
            sum(len(r["wh"]) for r in records if not r["mosaic"]) / max(len(records) - len(mos), 1)
        ),
        "share_min_side_lt_8px": float((min_side < 8).mean()) if len(wh) else None,
        "share_min_side_lt_4px": float((min_side < 4).mean()) if len(wh) else None,
        "share_min_side_le_2px": float((min_side <= 2).mean()) if len(wh) else None,
        "share_sqrt_area_lt_8px": float((sqrt_area < 8).mean()) if len(wh) else None,
        "min_side_px": quantiles(min_side),
        "sqrt_area_px": quantiles(sqrt_area),
        # mosaic samples: kept boxes by visible share of the whole box
        "kept_partial_lt_100": float((vis < 0.999).mean()) if len(vis) else None,
        "kept_partial_lt_50": float((vis < 0.5).mean()) if len(vis) else None,
        "kept_partial_lt_10": float((vis < 0.1).mean()) if len(vis) else None,
        # mosaic samples: of the source boxes visible at all, the share each pipeline keeps
        "visible_source_boxes": int(len(cand)),
        "kept_of_visible": kept_share(np.ones(len(cand), bool)),
        "kept_of_visible_lt_10": kept_share(cand < 0.1),
        "kept_of_visible_10_50": kept_share((cand >= 0.1) & (cand < 0.5)),
        "kept_of_visible_50_100": kept_share((cand >= 0.5) & (cand < 0.999)),
        "kept_of_visible_whole": kept_share(cand >= 0.999),
        "kept_of_visible_min_side_le_2px": kept_share(cand_side <= 2),
        "centre_visible": float(np.mean([r["centre_visible"] for r in mos])) if mos else None,
        "tile_cover": float(np.mean([r["tile_cover"] for r in mos])) if mos else None,
        "primary_cover": float(np.mean([r["primary_cover"] for r in mos])) if mos else None,
    }


def official_samples(root: Path, order: list[int], args) -> list[dict]:
    import yolox.data.data_augment as official_augment
    import yolox.data.datasets.mosaicdetection as official_mosaic
    from yolox.data import COCODataset, MosaicDetection, TrainTransform

    size = (args.size, args.size)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' progress lines
        dataset = COCODataset(str(root), "instances_train2017.json", "train2017", img_size=size, preproc=None)
    pipeline = MosaicDetection(
        dataset,
        img_size=size,
        mosaic=True,
        preproc=TrainTransform(max_labels=120, flip_prob=0.5, hsv_prob=1.0),
        degrees=args.degrees,
        translate=args.translate,
        mosaic_scale=tuple(args.mosaic_scale),
        shear=args.shear,
        enable_mixup=False,
        mosaic_prob=args.mosaic_prob,
    )
    watch = Watch(dataset)
    random.seed(args.seed)
    np.random.seed(args.seed)
    records = []
    with (
        recording(official_mosaic, "get_mosaic_coordinate", watch.placements),
        recording(official_augment, "get_affine_matrix", watch.matrices),
    ):
        placements = watch.placements
        for index in order:
            start = watch.mark()
            _, labels, _, _ = pipeline[(True, index)]
            labels = labels[labels.sum(1) > 0]
            # official's placement call passes (mosaic_image, k, xc, yc, ...): drop the image
            placements[start[1] :] = [((a[1], *a[2:]), kw, r) for a, kw, r in placements[start[1] :]]
            # and its get_affine_matrix returns (matrix, scale): keep the matrix
            watch.matrices[start[2] :] = [(a, kw, r[0]) for a, kw, r in watch.matrices[start[2] :]]
            rec = analyse(labels, watch, start, size)
            rec["fallback"] = bool(len(labels) and (np.minimum(labels[:, 3], labels[:, 4]) <= 1).any())
            records.append(rec)
    return records


def ours_samples(dataset_json: Path, order: list[int], args) -> list[dict]:
    import yolox_fast.data.mosaic as ours_mosaic
    from yolox_fast.exp import get_exp

    exp = get_exp(exp_name="yolox-nano")
    exp.merge(
        [
            "dataset", str(dataset_json), "num_classes", "4", "input_size", f"({args.size},{args.size})",
            "data_num_workers", "0", "mosaic_prob", str(args.mosaic_prob), "enable_mixup", "false",
            "degrees", str(args.degrees), "translate", str(args.translate), "shear", str(args.shear),
            "mosaic_scale", str(tuple(args.mosaic_scale)), "seed", str(args.seed), *args.ours_opts,
        ]
    )  # fmt: skip
    pipeline = exp.get_data_loader(batch_size=1, is_distributed=False).dataset
    watch = Watch(pipeline.dataset)
    records = []
    with (
        recording(ours_mosaic, "mosaic_placement", watch.placements),
        recording(ours_mosaic, "affine_matrix", watch.matrices),
    ):
        for position, index in enumerate(order):
            start = watch.mark()
            _, labels, _, _ = pipeline[(True, index, (args.seed, 0, position))]
            rec = analyse(np.asarray(labels, dtype=np.float64), watch, start, (args.size, args.size))
            rec["fallback"] = False
            records.append(rec)
    return records


def collect(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--num-images", type=int, default=60, help="generated training images")
    parser.add_argument("--image-size", type=int, default=320, help="generated image side")
    parser.add_argument("--size", type=int, default=320, help="network input side")
    parser.add_argument("--mosaic-prob", type=float, default=0.5)
    parser.add_argument("--mosaic-scale", type=float, nargs=2, default=(0.5, 1.5))
    parser.add_argument("--degrees", type=float, default=10.0)
    parser.add_argument("--translate", type=float, default=0.1)
    parser.add_argument("--shear", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--data", type=str, default=None, help="where to generate the set (default: a temp dir)"
    )
    parser.add_argument(
        "--ours-opts", nargs="*", default=[], help="extra exp overrides for ours: KEY VALUE ..."
    )
    args = parser.parse_args(argv)
    from benchmarks.kit.fidelity_data import make_fidelity_set

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data or tmp) / "fidelity_shapes"
        dataset_json = make_fidelity_set(root, num_train=args.num_images, num_val=4, size=args.image_size)
        rng = np.random.default_rng(args.seed)
        order = np.concatenate(
            [rng.permutation(args.num_images) for _ in range(args.samples // args.num_images + 1)]
        )[: args.samples].tolist()
        official = official_samples(root, order, args)
        ours = ours_samples(dataset_json, order, args)
    return {
        "settings": vars(args),
        "official": {
            **summarise(official),
            "fallback_samples": int(sum(r["fallback"] for r in official)),
        },
        "ours": summarise(ours),
    }


if __name__ == "__main__":
    common.run(collect)
