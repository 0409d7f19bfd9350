"""Accuracy side by side: official YOLOX 0.3.0 and yolox_fast trained on the same data, same recipe, same
seeds; AP50 and AP50:95 of each evaluated epoch, per seed, then mean and range over the seeds.

Run it with the reference python (it imports both; `tools/setup_yolox_reference.sh` makes it):

    $(tools/setup_yolox_reference.sh) tools/benchmark.py fidelity                     # the default run
    $(tools/setup_yolox_reference.sh) tools/benchmark.py fidelity --seeds 0 --num-train 48 --epochs 2
    ... fidelity --ours-opts simota_box_prior false simota_center_radius 1.5   # the later SimOTA rule
    ... fidelity --sides ours --ours-opts box_min_size 1 box_min_area_ratio 0 box_max_aspect inf

- Data: `kit.fidelity_data.make_fidelity_set` (generated shapes, 4 classes with category ids 3, 7, 11, 20,
  half the images non-square), written once under --out and reused.
- Official: its pieces in a plain loop, as its Trainer runs them (`kit.official.train_official`); its
  COCOEvaluator's scoring on the EMA model.
- yolox_fast: `tools/train.py -n yolox-nano` in a subprocess with the same fields as exp overrides;
  its trainer evaluates its EMA model.
- Same on both sides: yolox-nano, initial weights (same torch seed, verified in tests/test_vs_yolox.py),
  batch, optimizer steps (the default train set is a multiple of the batch: official counts
  ceil(N / batch) iterations per epoch, yolox_fast floor), input and test size, multi-scale off,
  test_conf 0.01, nmsthre 0.65, loader workers, torch threads; with the default --eval-interval 1 both
  evaluate every epoch. Not the same, by each side's own design (docs/fidelity.md): when mosaic closes
  and L1 starts, the affine pivot and box filter, the augmentation randomness (official reseeds its
  workers from uuid, yolox_fast draws from the seed and the sample position).

Cost: a nano step at 256 px, batch 16, takes about 1.3 s of one core (measured, either side), and the
loader workers use the other core; the default (208 train images -> 13 steps per epoch, 12 epochs, 3
seeds, both sides: 6 runs of 156 steps, plus 72 evaluations of 60 images) runs about 25 minutes on a
quiet 2-core CPU. Torch runs one thread per side by default (--threads): the loader workers need the
other core, and on the (shared, busy) development machine 2 threads made a step 4-7x slower than 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tabulate import tabulate

from benchmarks.kit.commands import REPO, overrides, tool
from benchmarks.kit.fidelity_data import make_fidelity_set
from benchmarks.kit.measure import spread
from benchmarks.kit.official import require_official_yolox
from benchmarks.kit.recipe import add_recipe_arguments, recipe

EVAL_LINE = re.compile(r"eval epoch (\d+): AP50:95 ([0-9.]+)\s+AP50 ([0-9.]+)")
ITERS_LINE = re.compile(r"iterations\s+(\d+) optimizer steps per epoch")
LOSS_LINE = re.compile(r"epoch: (\d+)/\d+, iter: \d+/\d+, .*?total_loss: ([0-9.]+)")


def run_official(args, root: Path, seed: int) -> dict:
    import torch

    from benchmarks.kit.official import official_nano_exp, train_official

    torch.set_num_threads(args.threads)
    fields = {
        **recipe(args, seed),
        "data_dir": str(root),
        "train_ann": "instances_train2017.json",
        "val_ann": "instances_val2017.json",
        "print_interval": 10**6,
    }
    exp = official_nano_exp(fields)
    start = time.perf_counter()

    def report(epoch: dict) -> None:
        line = f"  official seed {seed} epoch {epoch['epoch']}: loss {epoch['loss']:.3f}"
        if "ap50" in epoch:
            line += f", AP50 {epoch['ap50']:.4f} AP50:95 {epoch['ap50_95']:.4f}"
        print(line, flush=True)

    epochs, info = train_official(exp, args.batch, seed, on_epoch=report)
    return {
        "evals": {e["epoch"]: (e["ap50_95"], e["ap50"]) for e in epochs if "ap50" in e},
        "losses": {e["epoch"]: e["loss"] for e in epochs},
        "iters_per_epoch": info["iters_per_epoch"],
        "seconds": time.perf_counter() - start,
    }


def run_ours(args, dataset_json: Path, out: Path, seed: int) -> dict:
    fields = {**recipe(args, seed), "dataset": str(dataset_json), "output_dir": str(out / "ours")}
    name = f"seed{seed}" + ("_" + "_".join(args.ours_opts) if args.ours_opts else "")
    # print_interval 1: every step's loss is logged, for the per-epoch mean loss
    cmd = tool("train", "-n", "yolox-nano", "-b", args.batch, "-expn", name, "-l", "none", *overrides(fields),
               "print_interval", "1", "save_history_ckpt", "false", *args.ours_opts)  # fmt: skip
    log_dir = out / "ours" / name
    (log_dir / "train_log.txt").unlink(missing_ok=True)  # the log is appended across runs
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    with open(out / f"ours_{name}.out", "w") as console:
        proc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"yolox_fast training failed ({proc.returncode}); see {out / f'ours_{name}.out'}")
    log = (log_dir / "train_log.txt").read_text()
    evals = {int(e): (float(a), float(b)) for e, a, b in EVAL_LINE.findall(log)}
    step_losses: dict[int, list[float]] = {}
    for epoch, loss in LOSS_LINE.findall(log):
        step_losses.setdefault(int(epoch), []).append(float(loss))
    losses = {e: float(np.mean(v)) for e, v in step_losses.items()}
    for epoch in sorted(losses):
        line = f"  ours     seed {seed} epoch {epoch}: loss {losses[epoch]:.3f}"
        if epoch in evals:
            line += f", AP50 {evals[epoch][1]:.4f} AP50:95 {evals[epoch][0]:.4f}"
        print(line, flush=True)
    iters = ITERS_LINE.search(log)
    return {
        "evals": evals,
        "losses": losses,
        "iters_per_epoch": int(iters.group(1)) if iters else None,
        "seconds": seconds,
    }


def tables(results: dict, seeds: Sequence[int], sides: Sequence[str]) -> str:
    """Per seed: AP50, AP50:95 and mean training loss of each epoch, each side; then mean [min-max]."""
    headers = ["epoch", *(f"{s} {m}" for m in ("AP50", "AP50:95", "loss") for s in sides)]
    text = []
    for seed in seeds:
        per = results[seed]
        epochs = sorted(set().union(*(per[s]["evals"] for s in sides), *(per[s]["losses"] for s in sides)))
        rows = []
        for e in epochs:
            row = [e]
            row += [per[s]["evals"].get(e, (None, None))[1] for s in sides]
            row += [per[s]["evals"].get(e, (None, None))[0] for s in sides]
            row += [per[s]["losses"].get(e) for s in sides]
            rows.append(row)
        text.append(f"seed {seed}\n" + tabulate(rows, headers=headers, floatfmt=".4f", missingval="-"))
    epochs = sorted(set().union(*(results[seed][s]["evals"] for seed in seeds for s in sides)))
    rows = []
    for e in epochs:
        row = [e]
        for metric in ("AP50", "AP50:95", "loss"):
            for s in sides:
                if metric == "loss":
                    values = [
                        results[seed][s]["losses"][e] for seed in seeds if e in results[seed][s]["losses"]
                    ]
                else:
                    index = 1 if metric == "AP50" else 0
                    values = [
                        results[seed][s]["evals"][e][index]
                        for seed in seeds
                        if e in results[seed][s]["evals"]
                    ]
                row.append(spread(values))
        rows.append(row)
    text.append(
        f"mean [min-max] over seeds {' '.join(map(str, seeds))}\n"
        + tabulate(rows, headers=headers, disable_numparse=True)
    )
    return "\n\n".join(text)


def main(argv: Sequence[str]) -> None:
    p = argparse.ArgumentParser(
        prog="benchmark.py fidelity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sides", nargs="+", choices=("official", "ours"), default=["official", "ours"])
    p.add_argument("--num-train", type=int, default=400, help="generated training images")
    p.add_argument("--num-val", type=int, default=80, help="generated validation images")
    p.add_argument("--image-size", type=int, default=160, help="long side of the generated images")
    p.add_argument("--non-square", type=float, default=0.5, help="share of non-square images")
    p.add_argument("--category-ids", type=int, nargs=4, default=[3, 7, 11, 20])
    add_recipe_arguments(p)
    p.add_argument("--ours-opts", nargs="*", default=[], help="extra exp overrides for ours: KEY VALUE ...")
    p.add_argument("--out", default="YOLOX_outputs/fidelity", help="data, logs and results.json go here")
    args = p.parse_args(argv)
    if args.size % 32:
        p.error("--size must be a multiple of 32 (multi-scale is pinned to it)")
    if "official" in args.sides:
        require_official_yolox("fidelity")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = out / f"data_{args.num_train}_{args.num_val}_{args.image_size}"
    dataset_json = make_fidelity_set(
        root, args.num_train, args.num_val, args.image_size, 0, args.non_square, args.category_ids
    )
    steps_official = -(-args.num_train // args.batch)
    steps_ours = max(1, args.num_train // args.batch)
    print(
        f"fidelity: {', '.join(args.sides)}; yolox-nano, {args.num_train} train / {args.num_val} val images "
        f"({args.image_size} px, {args.non_square:.0%} non-square, category ids {args.category_ids}), input "
        f"{args.size}, batch {args.batch}, {args.epochs} epochs (warmup {args.warmup_epochs}, no-aug "
        f"{args.no_aug_epochs}), lr {args.basic_lr_per_img:.3g}/img, mosaic {args.mosaic_prob} "
        f"{tuple(args.mosaic_scale)}, degrees {args.degrees}, shear {args.shear}, no mixup, "
        f"seeds {args.seeds}, {args.workers} workers and {args.threads} threads each; "
        + (f"; ours with overrides {args.ours_opts}" if args.ours_opts else "")
    )
    if steps_official != steps_ours and len(args.sides) == 2:
        print(
            f"warning: {args.num_train} images is not a multiple of the batch {args.batch}: official runs "
            f"{steps_official} steps per epoch, yolox_fast {steps_ours}"
        )
    results: dict = {}
    start = time.perf_counter()
    for seed in args.seeds:
        results[seed] = {}
        if "official" in args.sides:
            results[seed]["official"] = run_official(args, root, seed)
        if "ours" in args.sides:
            results[seed]["ours"] = run_ours(args, dataset_json, out, seed)
    total = time.perf_counter() - start

    print("\n" + tables(results, args.seeds, args.sides))
    last = args.epochs
    finals = {
        s: [results[seed][s]["evals"][last][1] for seed in args.seeds if last in results[seed][s]["evals"]]
        for s in args.sides
    }
    if len(args.sides) == 2 and finals["official"] and finals["ours"]:
        official, ours = np.mean(finals["official"]), np.mean(finals["ours"])
        ratio = f"{ours / official:.3f}" if official > 0 else "n/a (official AP50 is 0)"
        print(
            f"\nepoch {last} AP50, mean over seeds: official {official:.4f}, ours {ours:.4f}, "
            f"ours / official {ratio}"
        )
    for s in args.sides:
        secs = [results[seed][s]["seconds"] for seed in args.seeds]
        iters = {results[seed][s]["iters_per_epoch"] for seed in args.seeds}
        print(
            f"{s}: {np.mean(secs) / 60:.1f} min per seed (incl. evaluation), {sorted(iters)} steps per epoch"
        )
    print(f"total wall time {total / 60:.1f} min")
    (out / "results.json").write_text(
        json.dumps(
            {"args": vars(args), "results": {str(k): v for k, v in results.items()}, "seconds": total},
            indent=1,
        )
    )
    print(f"results: {out / 'results.json'}")
