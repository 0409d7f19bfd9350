"""Fine-tuning side by side with official YOLOX 0.3.0 on real photos: the same COCO-trained weights, the same
labelled set, the same recipe and the same scorer (pycocotools) on both sides; AP50 and AP50:95 on the
validation images after every evaluated epoch, per seed, then mean and range over the seeds.

Run it with the reference python (it imports both; `tools/setup_yolox_reference.sh` makes it):

    $(tools/setup_yolox_reference.sh) tools/benchmark.py finetune                # raccoon, nano, 3 seeds
    ... finetune --tiled 3                   # the dense variant: raccoon photos tiled 3x3
    ... finetune --data path/to/my_set --weights yolox_nano.pth --seeds 0     # any layout yolox_fast reads
    ... finetune --example        # also: our example recipe against official's default, same minutes
    ... finetune --report a/results.json b/results.json     # no runs: several runs' results joined

- Data (--data): a dataset folder or description in any layout yolox_fast reads; default the raccoon set
  in ../shared/real/raccoon (LabelImg XML, the author's split in data/{train,test}_labels.csv). Official
  reads COCO only, so the benchmark writes the same images (linked) and boxes (as yolox_fast reads them)
  in its layout under --out; both sides train on the same boxes and score the same ground truth.
- Weights (--weights): default the COCO-trained nano in ../shared/weights. Both sides load the file as
  their `-c` does (the 80-class layer is skipped; it starts at the prior on both sides).
- Rows, all from the same start. `official`: official 0.3.0's pieces in a plain loop, as its Trainer runs
  them (`benchmarks/kit/official.py`). `official-later`: the same with the SimOTA candidate rule of
  official's later code (`use_later_assignment_rule`: centre radius 1.5, no box prior). `ours`:
  `tools/train.py -c WEIGHTS`, the recipe as exp overrides (its default SimOTA rule is official's later
  one; `ours-0.3.0`, only when asked, is the same with 0.3.0's rule, the default before 2026-12-07). When
  the weights' BatchNorm is folded into the convolutions (identity statistics, as these are), yolox_fast
  re-estimates it before training (exp.refit_folded_bn) and official cannot: official's rows then start
  from the weights after that refit (computed by yolox_fast's code on the same training images, saved as a
  file official's `-c` loads), the start a YOLOX user has with Megvii's own weights, which carry their
  statistics. `official-file` (only when
  asked, with --rows) trains official from the weights file as it is; `official-our-loader` (only when
  asked) is official's loop fed by yolox_fast's training loader (dataset, mosaic, affine, HSV, flip,
  sampler) on the same data: the data pipeline swapped, the rest official's.
- Dense variant (--tiled 3): every image of a split is a 3x3 tiling of nine photos of the same split
  (each photo fitted into its cell, grey around it; real pixels and real boxes), as many tiled images as
  photos, each photo once in every cell position. On the raccoon set that is about 10 boxes per image,
  most of them small at 416 px: a stand-in for dense real scenes, not a real dense set.
- Same on both sides: yolox-nano, batch, steps per epoch (the train set is cut to a multiple of the
  batch: official counts ceil(N / batch), yolox_fast floor), input and test size, multi-scale off,
  test_conf 0.01, nmsthre 0.65, loader workers, torch threads, the scorer. Not the same, by design
  (docs/fidelity.md): the affine pivot, where the box filter acts, the augmentation randomness.
- --example: `exps/example/finetune_nano.py` (our recipe for a few hundred photos) against official's
  yolox-nano exp as it ships (only the data and the class count changed) trained for as many minutes
  as ours took (evaluations included), each seed; the two phases run one after the other at the same
  parallelism.

Runs go --parallel at a time (default 2: two runs of one torch thread and one loader worker each fill the
2-core development machine; AP does not depend on it, minutes do).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tabulate import tabulate

from benchmarks.kit.commands import overrides, tool
from benchmarks.kit.inputs import WEIGHTS
from benchmarks.kit.measure import spread
from benchmarks.kit.official import RULE_0_3_0_FIELDS, require_official_yolox
from benchmarks.kit.recipe import add_recipe_arguments
from benchmarks.kit.recipe import recipe as fidelity_recipe
from yolox_fast.core.results import read_results

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
RACCOON = SHARED / "real" / "raccoon"
EXAMPLE_EXP = REPO / "exps" / "example" / "finetune_nano.py"
ROWS = ("official", "official-later", "ours", "official-file", "official-our-loader", "ours-0.3.0")
DEFAULT_ROWS = ROWS[:3]
EVAL_LINE = re.compile(r"eval epoch (\d+): AP50:95 ([0-9.]+)\s+AP50 ([0-9.]+)")


def raccoon_description(out: Path) -> Path:
    """The raccoon set as its author published it: LabelImg XML, the split in two CSV files."""
    if not RACCOON.is_dir():
        sys.exit(f"the default data {RACCOON} is not here: give --data (any dataset folder or description)")
    path = out / "raccoon.json"
    path.write_text(
        json.dumps(
            {
                "name": "raccoon",
                "format": "voc",
                "root": str(RACCOON),
                "images": "images",
                "annotations": "annotations",
                "train": {"csv": "data/train_labels.csv"},
                "val": {"csv": "data/test_labels.csv"},
            }
        )
    )
    return path


def read_set(data: str, batch: int):
    """(class names, train records cut to a multiple of `batch`, val records) as yolox_fast reads them."""
    from yolox_fast.data.build import build_eval_dataset, build_train_dataset, dataset_class_names
    from yolox_fast.exp import Exp

    exp = Exp()
    exp.dataset = data
    exp.num_classes = len(dataset_class_names(exp))
    train, val = build_train_dataset(exp), build_eval_dataset(exp)
    keep = len(train.records) // batch * batch
    return train.class_names, train.records[:keep], val.records


def write_official_layout(root: Path, names: Sequence[str], train, val) -> None:
    """`root/{train2017,val2017}/` (links to the images) and `root/annotations/instances_*.json`: the
    boxes yolox_fast trains on, and the ground truth as the annotation files give it for val."""
    for split, records, scored in (("train2017", train, False), ("val2017", val, True)):
        (root / split).mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for k, rec in enumerate(records, 1):
            name = f"{k:06d}{Path(rec.file).suffix.lower()}"
            link = root / split / name
            if not link.exists():
                os.symlink(rec.file, link)
            images.append({"id": k, "file_name": name, "width": rec.width, "height": rec.height})
            boxes, classes, difficult = (rec.raw_gt if scored and rec.raw_gt else None) or (
                rec.boxes,
                rec.classes,
                rec.difficult,
            )
            for (x1, y1, x2, y2), c, hard in zip(boxes.tolist(), classes.tolist(), difficult.tolist()):
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": k,
                        "category_id": int(c) + 1,
                        "bbox": [x1, y1, x2 - x1, y2 - y1],
                        "area": (x2 - x1) * (y2 - y1),
                        "iscrowd": int(hard),
                    }
                )
        categories = [{"id": i + 1, "name": n} for i, n in enumerate(names)]
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"instances_{split}.json").write_text(
            json.dumps({"images": images, "annotations": annotations, "categories": categories})
        )


def tiled_set(out: Path, names: Sequence[str], train, val, grid: int) -> Path:
    """A COCO folder (YOLOX's layout) whose every image tiles grid x grid photos of the same split; see the
    module docstring. Written once under `out` and reused."""
    import cv2

    root = out / f"tiled{grid}"
    done = root / "annotations" / "instances_val2017.json"
    if done.is_file():
        return root
    cell = 256  # px; at 416 px input a photo is then about 139 px across
    rng = np.random.default_rng(0)
    for split, records in (("train2017", train), ("val2017", val)):
        (root / split).mkdir(parents=True, exist_ok=True)
        # orders[k][i]: the photo in cell k of tiled image i; every photo once per cell position, nine
        # different photos in a tiled image (shifts of one permutation by distinct amounts)
        order = rng.permutation(len(records))
        shifts = rng.choice(len(records), size=grid * grid, replace=len(records) < grid * grid)
        orders = [np.roll(order, int(shift)) for shift in shifts]
        images, annotations = [], []
        for i in range(len(records)):
            canvas = np.full((grid * cell, grid * cell, 3), 114, np.uint8)
            for k, order in enumerate(orders):
                rec = records[int(order[i])]
                photo = cv2.imread(rec.file)
                h, w = photo.shape[:2]
                scale = min(cell / w, cell / h)
                pw, ph = round(w * scale), round(h * scale)
                x0 = (k % grid) * cell + (cell - pw) // 2
                y0 = (k // grid) * cell + (cell - ph) // 2
                canvas[y0 : y0 + ph, x0 : x0 + pw] = cv2.resize(photo, (pw, ph), interpolation=cv2.INTER_AREA)
                boxes, classes, difficult = (rec.raw_gt if split == "val2017" and rec.raw_gt else None) or (
                    rec.boxes,
                    rec.classes,
                    rec.difficult,
                )
                for (x1, y1, x2, y2), c, hard in zip(boxes.tolist(), classes.tolist(), difficult.tolist()):
                    bx, by, bw, bh = x0 + x1 * scale, y0 + y1 * scale, (x2 - x1) * scale, (y2 - y1) * scale
                    annotations.append(
                        {"id": len(annotations) + 1, "image_id": i + 1, "category_id": int(c) + 1,
                         "bbox": [bx, by, bw, bh], "area": bw * bh, "iscrowd": int(hard)}
                    )  # fmt: skip
            name = f"{i + 1:06d}.jpg"
            cv2.imwrite(str(root / split / name), canvas, [cv2.IMWRITE_JPEG_QUALITY, 95])
            images.append({"id": i + 1, "file_name": name, "width": grid * cell, "height": grid * cell})
        categories = [{"id": c + 1, "name": n} for c, n in enumerate(names)]
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"instances_{split}.json").write_text(
            json.dumps({"images": images, "annotations": annotations, "categories": categories})
        )
    return root


def refitted_weights(weights: str, names, train, size: int, out: Path) -> Path | None:
    """The weights after yolox_fast's folded-BN refit on the training images (as its trainer does it),
    or None when their BatchNorm is not folded."""
    import cv2
    import torch

    from yolox_fast.data.augment import letterbox_chw
    from yolox_fast.exp.build import get_exp
    from yolox_fast.models.folded_bn import has_folded_bn, refit_folded_bn
    from yolox_fast.utils.checkpoint import load_checkpoint, load_model_weights

    ckpt = load_checkpoint(weights)
    exp = get_exp(None, "yolox-nano")
    exp.num_classes = next(v.shape[0] for k, v in ckpt["model"].items() if k == "head.cls_preds.0.weight")
    model = exp.get_model()
    load_model_weights(model, ckpt, strict=True)
    if not has_folded_bn(model):
        return None
    # the trainer's choice: 128 images spread over the set, letterboxed as for evaluation
    picks = np.unique(np.linspace(0, len(train) - 1, min(128, len(train))).round().astype(int))
    images = torch.from_numpy(
        np.stack([letterbox_chw(cv2.imread(train[i].file), (size, size))[0] for i in picks])
    )
    refit_folded_bn(model, images.split(8))
    path = out / "weights_refitted.pth"
    torch.save({"model": model.state_dict()}, path)
    return path


def recipe(args, seed: int, num_classes: int) -> dict:
    """The exp fields both sides get: the fidelity benchmark's recipe, with the data's class count."""
    return {**fidelity_recipe(args, seed), "num_classes": num_classes}


# ------------------------------------------------------------------------------------------ one run each
def official_job(spec: dict) -> dict:
    """Run in a subprocess of its own (`--job`): official's loop on its layout, from spec["weights"]."""
    import torch

    from benchmarks.kit.official import official_nano_exp, train_official, use_later_assignment_rule

    torch.set_num_threads(spec["threads"])
    if spec.get("later_rule"):
        use_later_assignment_rule()
    fields = {
        **spec["fields"],
        "data_dir": spec["data_dir"],
        "train_ann": "instances_train2017.json",
        "val_ann": "instances_val2017.json",
        "print_interval": 10**6,
    }
    exp = official_nano_exp({k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    loader = our_train_loader(spec) if spec.get("our_data") else None
    start = time.perf_counter()
    epochs, info = train_official(
        exp,
        spec["batch"],
        spec["seed"],
        weights=spec["weights"],
        time_limit=spec.get("time_limit"),
        multiscale=spec.get("multiscale", False),
        train_loader=loader,
    )
    return {
        "evals": {str(e["epoch"]): (e["ap50_95"], e["ap50"]) for e in epochs if "ap50" in e},
        "train_seconds": sum(e["train_seconds"] for e in epochs),
        "seconds": time.perf_counter() - start,
        "iters_per_epoch": info["iters_per_epoch"],
        "steps": info["steps"],
    }


def our_train_loader(spec: dict):
    """yolox_fast's training loader (dataset, mosaic, affine, HSV, flip, sampler, collate) on the same data
    and recipe as the ours row, for official's loop: the row official-our-loader."""
    from yolox_fast.data.build import build_train_loader
    from yolox_fast.exp.build import get_exp

    exp = get_exp(None, "yolox-nano")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["fields"].items()}  # from JSON
    exp.merge(overrides({**fields, "dataset": spec["our_data"]}))  # typed and checked, as the ours row's
    return build_train_loader(exp, spec["batch"], is_distributed=False)


def run_official(spec: dict, out: Path) -> dict:
    job = out / f"{spec['name']}.job.json"
    job.write_text(json.dumps(spec))
    cmd = tool("benchmark", "finetune", "--job", job)
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "PYTHONPATH": str(REPO)}
    with open(out / f"{spec['name']}.out", "w") as console:
        proc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"official run failed ({proc.returncode}); see {out / (spec['name'] + '.out')}")
    return json.loads((out / f"{spec['name']}.json").read_text())


def run_ours(name: str, exp_args: list, fields: dict, extra: Sequence[str], weights: str, threads: int,
             out: Path) -> dict:  # fmt: skip
    batch = fields.pop("_batch")
    opts = [*overrides(fields), "output_dir", out / "ours", "save_history_ckpt", "false", "save_eval_report",
            "false", "coco_scorer", "pycocotools", *extra]  # fmt: skip
    cmd = tool("train", *exp_args, "-c", weights, "-b", batch, "-expn", name, "-l", "none", *opts)
    log = out / "ours" / name / "train_log.txt"
    log.unlink(missing_ok=True)  # the log is appended across runs
    log.with_name("results.csv").unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    with open(out / f"{name}.out", "w") as console:
        proc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"yolox_fast training failed ({proc.returncode}); see {out / (name + '.out')}")
    text = log.read_text()
    epochs = read_results(str(log.with_name("results.csv")))
    return {
        "evals": {e: (float(a), float(b)) for e, a, b in EVAL_LINE.findall(text)},
        # the epochs' wall time (steps, checkpoints, evaluations), as official's time limit counts it
        "train_seconds": sum(row["time_s"] for row in epochs),
        "seconds": time.perf_counter() - start,
    }


# ------------------------------------------------------------------------------------------ report
def table(results: dict, rows: Sequence[str], seeds: Sequence[int]) -> str:
    """Per evaluated epoch: AP50 and AP50:95 of each row, mean [min-max] over the seeds."""
    epochs = sorted({int(e) for r in rows for s in seeds for e in results[r].get(s, {}).get("evals", {})})
    body = []
    for e in epochs:
        line = [e]
        for index in (1, 0):
            for r in rows:
                line.append(spread([results[r][s]["evals"][str(e)][index] for s in seeds
                                    if str(e) in results[r].get(s, {}).get("evals", {})]))  # fmt: skip
        body.append(line)
    headers = ["epoch", *(f"{r} {m}" for m in ("AP50", "AP50:95") for r in rows)]
    return tabulate(body, headers=headers, disable_numparse=True)


def standing(results: dict, rows: Sequence[str], seeds: Sequence[int]) -> str:
    """Ours against each other row, means over the seeds both have: the evaluated epochs where ours is
    level or ahead, and the final epoch's difference."""

    def mean(row: str, epoch: str, index: int, both: Sequence[int]) -> float:
        return float(np.mean([results[row][s]["evals"][epoch][index] for s in both]))

    lines = []
    for other in (r for r in rows if r != "ours"):
        both = [s for s in seeds if s in results["ours"] and s in results[other]]
        evaluated = [set(results[r][s]["evals"]) for r in ("ours", other) for s in both]
        epochs = sorted(set.intersection(*evaluated), key=int)
        parts = []
        for index, metric in ((1, "AP50"), (0, "AP50:95")):
            level = sum(mean("ours", e, index, both) >= mean(other, e, index, both) for e in epochs)
            last = mean("ours", epochs[-1], index, both) - mean(other, epochs[-1], index, both)
            last_epoch = epochs[-1]
            parts.append(
                f"{metric} level or ahead at {level}/{len(epochs)} epochs, {last:+.3f} at {last_epoch}"
            )
        on = "" if len(both) == len(seeds) else f" (seeds {' '.join(map(str, both))})"
        lines.append(f"ours vs {other}{on}: " + "; ".join(parts))
    return "\n".join(lines)


# what may differ between the results files one report joins (the rest is the recipe and the data)
RUN_ONLY_ARGS = {"seeds", "rows", "parallel", "out", "job", "report", "example", "ours_opts"}


def report(paths: Sequence[str]) -> None:
    """The table and ours' standing of several results.json files of the same recipe and data, joined (a
    row and seed found in more than one file: the later file's run)."""
    results: dict = {}
    recipe_of = None
    for path in paths:
        saved = json.loads(Path(path).read_text())
        recipe_here = {k: v for k, v in saved["args"].items() if k not in RUN_ONLY_ARGS}
        if recipe_of is not None and recipe_here != recipe_of[1]:
            changed = sorted(k for k in recipe_here if recipe_here[k] != recipe_of[1].get(k))
            sys.exit(
                f"{path} ran another recipe or data than {recipe_of[0]} ({', '.join(changed)}): not joined"
            )
        recipe_of = recipe_of or (path, recipe_here)
        extra = saved["args"].get("ours_opts")
        for row, runs in saved["results"].items():
            if row in ROWS:
                name = f"ours {' '.join(extra)}" if row == "ours" and extra else row
                results.setdefault(name, {}).update({int(seed): run for seed, run in runs.items()})
    rows = [r for r in results if r in ROWS] + [r for r in results if r not in ROWS]
    seeds = sorted({s for r in rows for s in results[r]})
    counts = ", ".join(f"{r} {len(results[r])}" for r in rows)
    print(f"{len(paths)} results files; seeds per row: {counts}")
    print(f"mean [min-max] over the seeds each row has ({' '.join(map(str, seeds))})")
    print(table(results, rows, seeds))
    if "ours" in rows:
        print(standing(results, rows, seeds))


def boxes_per_image(records) -> float:
    return float(np.mean([len(r.boxes) for r in records])) if len(records) else 0.0


def main(argv: Sequence[str]) -> None:
    p = argparse.ArgumentParser(
        prog="benchmark.py finetune",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", default=None, help="dataset folder or description (default: the raccoon set)")
    p.add_argument("--weights", default=str(WEIGHTS), help="COCO-trained nano weights in official layout")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    add_recipe_arguments(
        p,
        size=416,
        epochs=15,
        batch=8,
        basic_lr_per_img=0.01 / 64,
        mosaic_prob=1.0,
        eval_interval=1,
        workers=1,
    )
    p.add_argument("--parallel", type=int, default=2, help="runs at a time")
    p.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS), choices=ROWS,
                   help=f"default: {' '.join(DEFAULT_ROWS)} (official-file: official from the weights file "
                        "as it is, without the refit; official-our-loader: official's loop fed by "
                        "yolox_fast's loader; ours-0.3.0: ours with YOLOX 0.3.0's SimOTA rule)")  # fmt: skip
    p.add_argument(
        "--tiled",
        type=int,
        default=0,
        metavar="N",
        help="the dense variant: every image an N x N tiling of the split's photos (0: off)",
    )
    p.add_argument(
        "--ours-opts",
        nargs="*",
        default=[],
        help="extra exp overrides for ours and the example: KEY VALUE ...",
    )
    p.add_argument("--example", action="store_true", help="also our example recipe vs official's default")
    p.add_argument("--out", default="YOLOX_outputs/finetune", help="data, logs and results.json go here")
    p.add_argument("--report", nargs="+", metavar="RESULTS_JSON",
                   help="no runs: the table of these results.json files joined (the same recipe and data; "
                        "e.g. more seeds run later into another --out)")  # fmt: skip
    p.add_argument("--job", help=argparse.SUPPRESS)  # internal: one official run, spec in this JSON file
    args = p.parse_args(argv)
    if args.report:
        report(args.report)
        return
    if args.job:
        spec = json.loads(Path(args.job).read_text())
        result = official_job(spec)
        Path(args.job).with_name(f"{spec['name']}.json").write_text(json.dumps(result))
        return
    if args.size % 32:
        p.error("--size must be a multiple of 32 (multi-scale is pinned to it)")
    require_official_yolox("finetune")
    if not Path(args.weights).is_file():
        sys.exit(f"weights not found: {args.weights} (give --weights)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = args.data or str(raccoon_description(out))
    names, train, val = read_set(data, args.batch)
    if args.tiled > 1:
        data = str(tiled_set(out, names, train, val, args.tiled))
        names, train, val = read_set(data, args.batch)
    official_data = out / "official_data"
    write_official_layout(official_data, names, train, val)
    refitted = refitted_weights(args.weights, names, train, args.size, out)
    # without a refit official's rows already start from the file
    rows = [r for r in args.rows if r != "official-file" or refitted is not None]
    shown = rows + (["example vs official default"] if args.example else [])
    print(
        f"finetune: {', '.join(shown)}; yolox-nano from {args.weights} on {data}: {len(train)} train / "
        f"{len(val)} val images ({boxes_per_image(train):.1f} / {boxes_per_image(val):.1f} boxes each), "
        f"{len(names)} classes ({', '.join(names[:5])}); input {args.size}, batch "
        f"{args.batch}, {args.epochs} epochs (warmup {args.warmup_epochs}, no-aug {args.no_aug_epochs}), "
        f"lr {args.basic_lr_per_img:.3g}/img, mosaic {args.mosaic_prob} {tuple(args.mosaic_scale)}, no "
        f"mixup, seeds {args.seeds}; {args.parallel} runs at a time, {args.workers} worker and "
        f"{args.threads} thread each" + (f"; ours with {args.ours_opts}" if args.ours_opts else ""),
        flush=True,
    )
    if refitted is None:
        print("the weights' BatchNorm is not folded: no refit on either side")
    start = time.perf_counter()

    def job(row: str, seed: int):
        fields = recipe(args, seed, len(names))
        if row.startswith("ours"):
            ours_fields = {**fields, "_batch": args.batch, "dataset": data}
            if row == "ours-0.3.0":
                ours_fields.update(RULE_0_3_0_FIELDS)
            exp_args = ["-n", "yolox-nano"]
            result = run_ours(
                f"{row}_s{seed}", exp_args, ours_fields, args.ours_opts, args.weights, args.threads, out
            )
            return row, seed, result
        spec = {
            "name": f"{row}_s{seed}",
            "fields": fields,
            "data_dir": str(official_data),
            "batch": args.batch,
            "seed": seed,
            "weights": str(refitted) if refitted is not None and row != "official-file" else args.weights,
            "threads": args.threads,
            "later_rule": row == "official-later",
            "our_data": data if row == "official-our-loader" else None,
        }
        return row, seed, run_official(spec, out)

    results: dict = {r: {} for r in rows}
    with ThreadPoolExecutor(args.parallel) as pool:
        for row, seed, result in pool.map(lambda rs: job(*rs), [(r, s) for s in args.seeds for r in rows]):
            results[row][seed] = result
            last = max(result["evals"], key=int)
            ap50_95, ap50 = result["evals"][last]
            minutes = result["seconds"] / 60
            print(
                f"  {row} seed {seed}: epoch {last} AP50 {ap50:.4f} AP50:95 {ap50_95:.4f} ({minutes:.1f} min)"
            )
    if rows:
        print(f"\nsame recipe, mean [min-max] over seeds {' '.join(map(str, args.seeds))}")
        print(table(results, rows, args.seeds))
        if "ours" in rows:
            print(standing(results, rows, args.seeds))
    if args.example:
        results.update(example(args, data, names, official_data, out))
    total = time.perf_counter() - start
    print(f"\ntotal wall time {total / 60:.1f} min")
    (out / "results.json").write_text(
        json.dumps({"args": vars(args), "results": results, "seconds": total}, indent=1)
    )
    print(f"results: {out / 'results.json'}")


def example(args, data: str, names, official_data: Path, out: Path) -> dict:
    """Our example recipe, then official's default recipe for the same minutes of training, each seed."""

    def ours(seed: int):
        fields = {"_batch": args.batch, "dataset": data, "seed": seed, "data_num_workers": args.workers}
        return seed, run_ours(f"example_s{seed}", ["-f", str(EXAMPLE_EXP)], fields, args.ours_opts,
                              args.weights, args.threads, out)  # fmt: skip

    with ThreadPoolExecutor(args.parallel) as pool:
        ours_results = dict(pool.map(ours, args.seeds))

    def official(seed: int):
        limit = ours_results[seed]["train_seconds"]
        fields = {"num_classes": len(names), "data_num_workers": args.workers, "seed": seed}
        spec = {"name": f"official_default_s{seed}", "fields": fields, "data_dir": str(official_data),
                "batch": args.batch, "seed": seed, "weights": args.weights, "threads": args.threads,
                "time_limit": limit, "multiscale": True}  # fmt: skip
        return seed, run_official(spec, out)

    with ThreadPoolExecutor(args.parallel) as pool:
        official_results = dict(pool.map(official, args.seeds))
    body = []
    for seed in args.seeds:
        o, d = ours_results[seed], official_results[seed]
        ol, dl = max(o["evals"], key=int), max(d["evals"], key=int)
        body.append([seed, o["train_seconds"] / 60, ol, o["evals"][ol][1], o["evals"][ol][0],
                     d["train_seconds"] / 60, dl, d["evals"][dl][1], d["evals"][dl][0]])  # fmt: skip
    body.append(["mean", *np.mean([[float(v) for v in row[1:]] for row in body], axis=0)])
    print("\nour example recipe (exps/example/finetune_nano.py) vs official's default recipe, same minutes")
    print(tabulate(body, headers=["seed", "ours min", "epochs", "AP50", "AP50:95", "official min", "epochs",
                                  "AP50", "AP50:95"], floatfmt=("", ".1f", ".1f", ".4f", ".4f", ".1f", ".1f",
                                  ".4f", ".4f")))  # fmt: skip
    return {"example": ours_results, "official-default": official_results}
