"""Speed side by side with official YOLOX 0.3.0, on this machine, in one run: ratios of like with like.

Run it with the reference python (it imports both; `tools/setup_yolox_reference.sh` makes it):

    $(tools/setup_yolox_reference.sh) tools/benchmark.py vs-yolox                 # CPU: batch 16 and 64
    $(tools/setup_yolox_reference.sh) tools/benchmark.py vs-yolox --only iteration --batches 16
    $(tools/setup_yolox_reference.sh) tools/benchmark.py vs-yolox --device cuda --fp16 --batches 64 128 256
    $(tools/setup_yolox_reference.sh) tools/benchmark.py vs-yolox --only inference --inference-batch 32

Four measurements, each alternating the two sides repeat by repeat (load from other processes hits both
alike; the median of the repeats is reported, and their range):

- iteration: one full training step with the data excluded: forward, loss (with its SimOTA assignment),
  backward, SGD step (each side's own parameter groups), EMA update. yolox-nano, random images, random
  ground truth shaped like training (5-40 boxes per image), the same weights on both sides. Also "ours,
  trainer": the same step through `Trainer.train_one_iter` (lr update, BN snapshot, the non-finite checks
  and their collective, EMA, meters, logging), the trainer's overhead over the bare step. Each row's
  GFLOP/s is the network's counted forward + backward FLOPs (the same network on both sides) times its
  images/s, and "of peak" that over this machine's peak (matmul, 3x3 conv) measured in the same run.
- data: CPU seconds per training sample (process time of one worker's work: `MosaicDetection` with
  mosaic, random affine, HSV, flip and the final transform), official's `MosaicDetection` +
  `TrainTransform` against ours, on the same generated images with the same augmentation settings, no
  cache, OpenCV on one thread as in a loader worker.
- end-to-end: images per second of short training runs on the same generated data (the same recipe,
  loader workers and threads): official's pieces in a plain loop (its trainer is CUDA-only) against
  `tools/train.py`; the first epoch (worker start-up, first allocations) is left out. With
  --e2e-compile-repeats N, N more runs of `tools/train.py --compile` (inductor): their first epoch, also
  left out, is where the graphs are compiled; the row's name says how long that took. With --e2e-bf16, a
  third side, alternated with the two, runs `tools/train.py --bf16` (bf16 autocast; official has no
  autocast on a CPU). Each row also has the mean total loss of the last epoch's steps (the median over the
  repeats): a reduced-precision run trains like the fp32 one.
- inference: images per second, fp32, the same weights on both sides (official's yolox-nano, or
  --inference-weights loaded into it, its state_dict shared), on the same generated validation images
  (--inference-images, at nano's test size unless --inference-size), after one untimed round.
  Official's model has its BatchNorm folded (`fuse_model`, what its eval and demo tools' --fuse do).
  Evaluation: official's COCOEvaluator path (its loader, forward, postprocess, COCO records,
  evaluate_prediction) against `evaluator.evaluate` as `tools/eval.py -b B` runs it (loading, forward,
  NMS, scoring; without the report files) with its defaults (BatchNorm folded, NHWC) and with
  --no-fuse --no-channels-last (the layers and layout official runs); both at batch B with the same loader
  workers, each with its AP50:95, AP50 and number of detections. Demo: official's demo Predictor (one
  image at a time: ValTransform, forward, class-agnostic postprocess, boxes back to image pixels) against
  our Predictor as `tools/demo.py` runs it at -b 1 and -b B, on images decoded beforehand (no file
  reading, no drawing), at the demo's thresholds. A checkpoint with more classes than the set's 4 (the
  COCO nano in ../shared/weights, the default when it is there) keeps the 4 class rows it predicts most
  on these images: trained weights find boxes, official's random initialisation finds none above the
  thresholds (AP 0 on both sides says little). Run with other sections, it runs in a process of its own
  (this benchmark again with `--only inference`), as a user's evaluation does: after the in-process
  training sections both sides evaluate markedly slower (see `inference_in_own_process`). That process
  lets glibc keep freed memory, as tools/eval.py and tools/demo.py do (`utils.allocator`): official's side
  gets it too, which its own tools do not have.
- eval-process: seconds of one whole evaluation process per side, as a user types it, on the same
  generated validation images (--eval-images at nano's test size) and the same weights (those of the
  inference section): `tools/eval.py -c W -b B --conf 0.001 --fuse` against official's `tools/eval.py`
  with the same flags (`benchmarks/kit/official_eval.py`: its steps on a CPU). Everything a user waits for
  counts: start-up, imports, dataset and model loading, evaluation, and what each tool writes after
  (ours its report pictures and detections json). Fresh processes, alternated; each row also says its
  detections and AP, which must be equal.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tabulate import tabulate

from benchmarks.kit.commands import REPO, STEP_LINE, overrides, tool
from benchmarks.kit.fidelity_data import CLASS_NAMES, make_fidelity_set
from benchmarks.kit.inputs import WEIGHTS, random_batch
from benchmarks.kit.measure import alternate, median_and_range, ratio, setting, timed, value_range
from benchmarks.kit.official import require_official_yolox
from benchmarks.kit.peak import achieved_columns, measured_peak, peak_line, train_step_flops_per_image
from benchmarks.kit.recipe import recipe, recipe_args
from benchmarks.kit.steps import official_step, ours_step
from yolox_fast.utils.metric import sync_device

COMPILE_LINE = re.compile(r"torch\.compile so far: \d+ graphs? compiled in ([0-9.]+) s")
SECTIONS = ("iteration", "data", "end-to-end", "inference", "eval-process")
BF16_SIDE = "ours, --bf16 (autocast; official has none on a CPU)"


# --------------------------------------------------------------------------- iteration
def trainer_step(args, device: torch.device, batch, root: Path, out: Path, state_dict):
    """`Trainer.train_one_iter` on a fixed batch: a Trainer set up on the generated set, its batch stream
    replaced by the batch (so no data time is counted), its model given the same weights."""
    from yolox_fast.core.trainer import Trainer
    from yolox_fast.tools import train as train_tool
    from yolox_fast.utils.ema import unwrap_model

    size = batch[0].shape[-1]
    flags = ["-n", "yolox-nano", "-b", str(batch[0].shape[0]), "-expn", "vs_yolox_trainer", "-l", "none"]
    if args.fp16:
        flags.append("--fp16")
    opts = ["dataset", str(root), "num_classes", str(args.num_classes), "input_size", f"({size},{size})",
            "test_size", f"({size},{size})", "random_size", f"({size // 32},{size // 32})",
            "output_dir", str(out), "data_num_workers", "0", "print_interval", "10"]  # fmt: skip
    targs = train_tool.parse_args([*flags, *opts])
    exp = train_tool.build_exp(targs)
    trainer = Trainer(exp, targs)
    trainer.before_train()
    unwrap_model(trainer.model).load_state_dict(state_dict)
    trainer.batches = itertools.repeat(batch)

    def step() -> None:
        trainer.train_one_iter()

    return trainer, step


def measure_iteration(
    args, device: torch.device, amp_dtype, out: Path, dataset_json: Path
) -> tuple[list[list], str]:
    """(table rows, the line naming the peak they are measured against): seconds per training step of each
    side, and the FLOP/s that makes (the model's counted forward + backward FLOPs, the same network on
    both sides) against this machine's peak measured in the same run."""
    peak = measured_peak(device, amp_dtype)
    rows, flops_per_image = [], None
    for batch_size in args.batches:
        imgs, targets = random_batch(batch_size, args.size, args.num_classes, device)
        torch.manual_seed(0)
        official_model, official = official_step(device, args.num_classes, amp_dtype)
        ours_model, ours = ours_step(device, args.num_classes, amp_dtype, official_model.state_dict())
        if flops_per_image is None:  # linear in the batch: counted once, on two images
            twin = copy.deepcopy(ours_model)
            flops_per_image = train_step_flops_per_image(twin, imgs[:2], targets[:2], amp_dtype)
            del twin
        trainer, ours_trainer = trainer_step(
            args, device, (imgs, targets), dataset_json, out, official_model.state_dict()
        )
        sides = {
            "official": timed(lambda: official(imgs, targets.clone()), device=device),
            "ours": timed(lambda: ours(imgs, targets), device=device),
            "ours, trainer": timed(ours_trainer, device=device),
        }
        alternate(sides, args.warmup)
        repeats = alternate(sides, args.repeats)
        times = {k: statistics.median(v) for k, v in repeats.items()}
        for name, seconds in times.items():
            rates = [batch_size / t for t in repeats[name]]
            rows.append([
                batch_size, name, f"{seconds:.3f}", f"{batch_size / seconds:.1f}", value_range(rates, 1),
                ratio(times["official"], seconds),
                f"{100 * (seconds / times['ours'] - 1):+.1f}%" if name == "ours, trainer" else "",
                *achieved_columns(flops_per_image, batch_size / seconds, peak),
            ])  # fmt: skip
        del trainer
    flops = f"{flops_per_image / 1e9:.2f} GFLOPs per image and step"
    return rows, f"{flops}; {peak_line(peak, setting(device, amp_dtype))}"


# --------------------------------------------------------------------------- data
def data_pipelines(args, root: Path):
    """(official MosaicDetection, ours) over the same images with nano's augmentation settings."""
    from yolox.data import COCODataset as OfficialCOCO
    from yolox.data import MosaicDetection as OfficialMosaic
    from yolox.data import TrainTransform as OfficialTransform

    from yolox_fast.exp import get_exp

    exp = get_exp(exp_name="yolox-nano")
    exp.input_size = (args.size, args.size)
    official_dataset = OfficialCOCO(
        data_dir=str(root), json_file="instances_train2017.json", name="train2017", img_size=exp.input_size,
        preproc=OfficialTransform(max_labels=50, flip_prob=exp.flip_prob, hsv_prob=exp.hsv_prob),
    )  # fmt: skip
    official = OfficialMosaic(
        official_dataset, mosaic=True, img_size=exp.input_size,
        preproc=OfficialTransform(max_labels=120, flip_prob=exp.flip_prob, hsv_prob=exp.hsv_prob),
        degrees=exp.degrees, translate=exp.translate, mosaic_scale=exp.mosaic_scale,
        mixup_scale=exp.mixup_scale, shear=exp.shear, enable_mixup=exp.enable_mixup,
        mosaic_prob=exp.mosaic_prob, mixup_prob=exp.mixup_prob,
    )  # fmt: skip
    exp.dataset, exp.num_classes, exp.seed, exp.data_num_workers = str(root / "dataset.json"), 4, 0, 0
    ours = exp.get_data_loader(batch_size=1, is_distributed=False).dataset
    return official, ours


def measure_data(args, root: Path) -> list[list]:
    import cv2

    cv2.setNumThreads(1)  # a loader worker's view
    official, ours = data_pipelines(args, root)
    n = len(ours)
    counter = itertools.count()

    def per_sample(pipeline, item: Callable[[int], object]) -> Callable[[], float]:
        return timed(lambda: pipeline[item(next(counter) % n)], args.samples, clock=time.process_time)

    official.enable_mosaic = True
    sides = {
        "official": per_sample(official, lambda i: i),
        "ours": per_sample(ours, lambda i: (True, i, (0, i))),
    }
    alternate(sides, 1)
    repeats = {k: [1000 * x for x in v] for k, v in alternate(sides, args.data_repeats).items()}
    ms = {k: statistics.median(v) for k, v in repeats.items()}
    return [[name, *median_and_range(repeats[name], 2), ratio(ms["official"], v)] for name, v in ms.items()]


# --------------------------------------------------------------------------- end to end
def end_to_end_official(args, root: Path, epochs: int, batch: int) -> tuple[float, float]:
    """(img/s of official's loop after its first epoch, mean total loss of its last epoch's steps)."""
    from benchmarks.kit.official import official_nano_exp, train_official

    fields = {**end_to_end_recipe(args, epochs), "data_dir": str(root), "eval_interval": 10**6,
              "train_ann": "instances_train2017.json", "val_ann": "instances_val2017.json"}  # fmt: skip
    epochs_done, info = train_official(official_nano_exp(fields), batch, 0)
    seconds = sum(e["train_seconds"] for e in epochs_done[1:])
    return (epochs - 1) * info["iters_per_epoch"] * batch / seconds, epochs_done[-1]["loss"]


def end_to_end_ours(
    args,
    dataset_json: Path,
    out: Path,
    epochs: int,
    batch: int,
    use_compile: bool = False,
    bf16: bool = False,
) -> tuple[float, float, float | None]:
    """(img/s of `tools/train.py` after its first epoch, mean total loss of its last epoch's steps, with
    `use_compile` the seconds its `--compile` run spent compiling as its log says after epoch 1, else
    None); `bf16`: the run with --bf16."""
    fields = {**end_to_end_recipe(args, epochs), "dataset": str(dataset_json), "output_dir": str(out)}
    flags = ["--compile", "compile_backend", args.compile_backend] if use_compile else []
    flags += ["--bf16"] if bf16 else []
    cmd = tool("train", "-n", "yolox-nano", "-b", batch, "-expn", "vs_yolox_e2e", "-l", "none", *flags,
               *overrides(fields), "print_interval", "1", "eval_interval", "1000000",
               "save_history_ckpt", "false")  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"tools/train.py failed:\n{done.stderr[-3000:]}")
    steps = [(int(m[1]), float(m[2]), float(m[3])) for m in STEP_LINE.finditer(done.stderr)]
    later = [t for epoch, t, _ in steps if epoch > 1]
    last_losses = [loss for epoch, _, loss in steps if epoch == epochs]
    compile_seconds = None
    if use_compile:
        compiled = COMPILE_LINE.search(done.stderr)
        if compiled is None:
            raise RuntimeError("tools/train.py --compile logged no compile statistics")
        compile_seconds = float(compiled[1])
    return len(later) * batch / sum(later), sum(last_losses) / len(last_losses), compile_seconds


def end_to_end_recipe(args, epochs: int) -> dict:
    """The exp fields of both sides' end-to-end runs: the fidelity suite's recipe at this one's sizes, seed 0,
    no evaluation."""
    return recipe(recipe_args(size=args.size, epochs=epochs, no_aug_epochs=0, eval_interval=10**6,
                              workers=args.workers), 0)  # fmt: skip


def measure_end_to_end(args, root: Path, dataset_json: Path, out: Path) -> list[list]:
    torch.set_num_threads(args.threads)
    sides = {
        "official": lambda: end_to_end_official(args, root, args.epochs, args.e2e_batch),
        "ours": lambda: end_to_end_ours(args, dataset_json, out, args.epochs, args.e2e_batch)[:2],
    }
    if args.e2e_bf16:
        sides[BF16_SIDE] = lambda: end_to_end_ours(
            args, dataset_json, out, args.epochs, args.e2e_batch, bf16=True
        )[:2]
    runs = alternate(sides, args.e2e_repeats)  # side -> [(img/s, last-epoch loss)]
    if args.e2e_compile_repeats:
        compiled = [
            end_to_end_ours(args, dataset_json, out, args.epochs, args.e2e_batch, use_compile=True)
            for _ in range(args.e2e_compile_repeats)
        ]
        seconds = statistics.median(s for *_, s in compiled)
        name = f"ours, --compile ({args.compile_backend}; epoch 1 untimed: {seconds:.0f} s compiling)"
        runs[name] = [(rate, loss) for rate, loss, _ in compiled]
    rates = {k: statistics.median(rate for rate, _ in v) for k, v in runs.items()}
    return [[name, *median_and_range([rate for rate, _ in runs[name]], 2), ratio(r, rates["official"]),
             f"{statistics.median(loss for _, loss in runs[name]):.3f}"]
            for name, r in rates.items()]  # fmt: skip


# --------------------------------------------------------------------------- inference
def inference_state_dict(args, num_classes: int, evaluator) -> tuple[dict, str]:
    """(official yolox-nano's state_dict for `num_classes`, where its weights come from).

    --inference-weights: a checkpoint in official's layout. One trained for more classes (the COCO nano)
    keeps the `num_classes` class rows it predicts most often on the evaluator's images, so that it finds
    boxes on the generated shapes (its first four, person to motorcycle, find almost none there); which
    classes they name does not matter, both sides score the same boxes. Without it: official's
    initialisation, seeded.
    """
    from benchmarks.kit.official import official_nano_exp
    from yolox_fast.utils.checkpoint import load_checkpoint, model_state_dict

    torch.manual_seed(0)
    model = official_nano_exp({"num_classes": num_classes}).get_model()
    if args.inference_weights is None:
        return model.state_dict(), "official's random initialisation"
    state = dict(model_state_dict(load_checkpoint(args.inference_weights)))
    trained_classes = len(state["head.cls_preds.0.bias"])
    text = args.inference_weights
    if trained_classes > num_classes:
        trained = official_nano_exp({"num_classes": trained_classes}).get_model()
        trained.load_state_dict(state)
        rows = most_predicted_classes(trained.eval(), trained_classes, evaluator)[:num_classes]
        for key in state:
            if ".cls_preds." in key:
                state[key] = state[key][rows]
        text += f", its classes {', '.join(map(str, rows))} of {trained_classes} (the most predicted here)"
    model.load_state_dict(state)  # strict: a checkpoint of another model fails here, not in a figure
    return model.state_dict(), text


@torch.no_grad()
def most_predicted_classes(model, num_classes: int, evaluator) -> list[int]:
    """Class indices by how many of `model`'s boxes on the evaluator's images name them, most first
    (official's postprocess at the evaluator's thresholds; ties by index)."""
    from yolox.utils import postprocess

    counts = torch.zeros(num_classes, dtype=torch.long)
    for imgs, *_ in evaluator.dataloader:
        for kept in postprocess(model(imgs), num_classes, evaluator.confthre, evaluator.nmsthre):
            if kept is not None:
                counts += torch.bincount(kept[:, 6].long(), minlength=num_classes)
    return sorted(range(num_classes), key=lambda c: (-int(counts[c]), c))


def measure_inference(args, device: torch.device, out: Path) -> tuple[list[list], str]:
    """(table rows, what ran) of the inference section."""
    import cv2
    from loguru import logger
    from yolox.data.data_augment import ValTransform
    from yolox.utils import fuse_model
    from yolox.utils import postprocess as official_postprocess

    from benchmarks.kit.official import official_detections, official_nano_exp, official_score
    from yolox_fast.core.demo import DEMO_CONF, DEMO_NMS, list_images
    from yolox_fast.exp import get_exp
    from yolox_fast.inference import Predictor, load_inference_model
    from yolox_fast.utils.allocator import keep_freed_memory

    keep_freed_memory()  # as our tools do; process-wide, so both sides run with it
    torch.set_num_threads(args.threads)
    num_classes, batch, n = len(CLASS_NAMES), args.inference_batch, args.inference_images
    exp = get_exp(exp_name="yolox-nano")
    size = args.inference_size or exp.test_size[0]
    dataset_json = make_fidelity_set(out / f"inference_{n}_{size}", 0, n, size)
    root = dataset_json.parent
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' "loading annotations" lines
        official_exp = official_nano_exp({
            "num_classes": num_classes, "data_dir": str(root), "val_ann": "instances_val2017.json",
            "test_size": (size, size), "data_num_workers": args.workers,
        })  # fmt: skip
        official_evaluator = official_exp.get_evaluator(batch_size=batch, is_distributed=False)
    state, weights_text = inference_state_dict(args, num_classes, official_evaluator)
    weights = out / "inference_weights.pth"
    torch.save({"model": state}, weights)
    official_model = official_exp.get_model()
    official_model.load_state_dict(state)
    # as its users run it: official's tools/eval.py and tools/demo.py fold BatchNorm with --fuse
    official_model = fuse_model(official_model.to(device).eval())

    exp.merge(["dataset", str(dataset_json), "num_classes", str(num_classes), "test_size", f"({size},{size})",
               "data_num_workers", str(args.workers)])  # fmt: skip
    exp.validate()
    exp.prepare_dataset()
    evaluator = exp.get_evaluator(batch, False)
    # what tools/eval.py and tools/demo.py run by default: BatchNorm folded, NHWC (exp.channels_last)
    ours_model, evaluator.class_names = load_inference_model(
        exp, str(weights), device, True, exp.channels_last
    )
    exp.model = None  # get_model() keeps the model it built (YOLOX's way): a second, separate one
    plain_model, _ = load_inference_model(exp, str(weights), device)
    predictor = Predictor(
        ours_model, num_classes, exp.test_size, DEMO_CONF, DEMO_NMS, device, channels_last=exp.channels_last,
        class_agnostic=True,
    )  # fmt: skip
    images = [cv2.imread(str(path)) for path in list_images(str(root / "val2017"))]

    # side -> (detections, and for an evaluation AP50:95, AP50) of its last run
    found: dict[tuple, tuple] = {}

    def timed(side: tuple, run: Callable[[], tuple]) -> Callable[[], float]:
        def measure() -> float:
            sync_device(device)
            t0 = time.perf_counter()
            found[side] = run()
            sync_device(device)
            return n / (time.perf_counter() - t0)

        return measure

    def official_eval() -> tuple:
        records = official_detections(official_evaluator, official_model)
        return len(records), *official_score(official_evaluator, records)

    def ours_eval(model) -> Callable[[], tuple]:
        def run() -> tuple:
            ap50_95, ap50, _ = evaluator.evaluate(model)
            return sum(len(d) for d in evaluator.last_merged.detections.values()), ap50_95, ap50

        return run

    @torch.no_grad()
    def official_demo() -> tuple:
        preproc, boxes = ValTransform(legacy=False), 0
        for img in images:
            ratio = min(size / img.shape[0], size / img.shape[1])
            x, _ = preproc(img, None, (size, size))
            outputs = official_model(torch.from_numpy(x).unsqueeze(0).float().to(device))
            kept = official_postprocess(outputs, num_classes, DEMO_CONF, DEMO_NMS, class_agnostic=True)[0]
            if kept is not None:
                kept = kept.cpu()
                # boxes in image pixels, score = obj * cls: what its visual() computes before drawing, and
                # what our Predictor returns, so both sides do that work
                dets = torch.cat([kept[:, :4] / ratio, kept[:, 4:5] * kept[:, 5:6], kept[:, 6:7]], 1)
                boxes += len(dets)
        return (boxes,)

    def ours_demo(b: int) -> Callable[[], tuple]:
        def run() -> tuple:
            return (sum(len(d) for i in range(0, n, b) for d in predictor.predict(images[i : i + b])),)

        return run

    runs = {
        ("evaluation", "official", batch): official_eval,
        ("evaluation", "ours", batch): ours_eval(ours_model),
        ("evaluation", "ours, --no-fuse --no-channels-last", batch): ours_eval(plain_model),
        ("demo", "official", 1): official_demo,
        ("demo", "ours", 1): ours_demo(1),
        ("demo", "ours", batch): ours_demo(batch),
    }
    sides = {side: timed(side, run) for side, run in runs.items()}
    logger.disable("yolox_fast")  # the evaluators' progress and summaries, every repeat
    logger.disable("yolox")
    try:
        alternate(sides, 1)  # untimed: oneDNN picks its kernels per shape, loaders and caches warm up
        repeats = alternate(sides, args.inference_repeats)
    finally:
        logger.enable("yolox_fast")
        logger.enable("yolox")
    official = {task: statistics.median(v) for (task, name, _), v in repeats.items() if name == "official"}
    rows = []
    for (task, name, b), rates in repeats.items():
        median = statistics.median(rates)
        detections, *ap = found[(task, name, b)]
        rows.append([task, name, b, *median_and_range(rates, 1), ratio(median, official[task]),
                     detections, *(f"{x:.4f}" for x in ap)])  # fmt: skip
    what = (
        f"{n} generated validation images at {size} px, weights: {weights_text}; fp32, {args.threads} torch "
        f"threads, {args.workers} eval loader workers per side; median and range of {args.inference_repeats} "
        "alternating repeats"
    )
    return rows, what


def measure_eval_process(args, out: Path) -> tuple[list[list], str]:
    """(table rows, what ran) of the eval-process section: whole `tools/eval.py` processes, both sides."""
    num_classes, batch, n = len(CLASS_NAMES), args.inference_batch, args.eval_images
    size = args.inference_size or 416  # nano's test size
    dataset_json = make_fidelity_set(out / f"eval_process_{n}_{size}", 0, n, size)
    root = dataset_json.parent
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' "loading annotations" lines
        from benchmarks.kit.official import official_nano_exp

        official_evaluator = official_nano_exp({
            "num_classes": num_classes, "data_dir": str(root), "val_ann": "instances_val2017.json",
            "test_size": (size, size), "data_num_workers": args.workers,
        }).get_evaluator(batch_size=batch, is_distributed=False)  # fmt: skip
        state, weights_text = inference_state_dict(args, num_classes, official_evaluator)
    weights = out / "eval_process_weights.pth"
    torch.save({"model": state}, weights)
    common = ["-c", str(weights), "-b", str(batch), "--conf", "0.001", "--fuse", "--tsize", str(size)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    commands = {
        "official": [sys.executable, str(REPO / "benchmarks" / "kit" / "official_eval.py"), "-n",
                     "yolox-nano", *common, "data_dir", str(root), "val_ann", "instances_val2017.json",
                     "num_classes", str(num_classes), "data_num_workers", str(args.workers),
                     "output_dir", str(out / "eval_process_official")],
        "ours": tool("eval", "-n", "yolox-nano", *common, "dataset", dataset_json, "num_classes", num_classes,
                     "data_num_workers", args.workers, "output_dir", out / "eval_process_ours"),
    }  # fmt: skip
    found: dict[str, tuple] = {}

    def timed(name: str) -> Callable[[], float]:
        def measure() -> float:
            t0 = time.perf_counter()
            done = subprocess.run(commands[name], capture_output=True, text=True, timeout=3600, env=env)
            seconds = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"{name}'s eval failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
            found[name] = eval_result(name, done.stdout + done.stderr)
            return seconds

        return measure

    seconds = alternate({name: timed(name) for name in commands}, args.eval_repeats)
    official = statistics.median(seconds["official"])
    rows = []
    for name, values in seconds.items():
        median = statistics.median(values)
        rows.append([name, *median_and_range(values, 1), f"{n / median:.1f}", ratio(official, median),
                     *found[name]])  # fmt: skip
    what = (
        f"one `tools/eval.py -b {batch} --conf 0.001 --fuse` process per side, {n} generated validation "
        f"images at {size} px, weights: {weights_text}; fp32, {args.threads} torch threads, "
        f"{args.workers} loader workers; median and range of {args.eval_repeats} alternated fresh processes"
    )
    return rows, what


OURS_AP = re.compile(r"AP50:95 ([0-9.]+)  AP50 ([0-9.]+)")
OFFICIAL_AP = re.compile(r"^detections (\d+) AP50:95 ([0-9.]+) AP50 ([0-9.]+)$", re.M)
OURS_REPORT = re.compile(r"eval report written to (.+?): ")


def eval_result(name: str, output: str) -> tuple[str, str, str]:
    """(detections, AP50:95, AP50) as one eval process printed them."""
    if name == "official":
        found = OFFICIAL_AP.search(output)
        if found is None:
            raise RuntimeError(f"official's eval printed no result line:\n{output[-2000:]}")
        return found[1], found[2], found[3]
    ap, report = OURS_AP.search(output), OURS_REPORT.search(output)
    if ap is None or report is None:
        raise RuntimeError(f"tools/eval.py printed no AP or report folder:\n{output[-2000:]}")
    detections = json.loads((Path(report[1]) / "detections.json").read_text())
    return str(len(detections)), ap[1], ap[2]


def main(argv) -> None:
    p = argparse.ArgumentParser(prog="benchmark.py vs-yolox", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--only", choices=SECTIONS, nargs="+", default=list(SECTIONS))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--fp16", action="store_true", help="fp16 autocast + loss scaling on both sides (CUDA)")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64], help="iteration: batch sizes")
    p.add_argument("--size", type=int, default=320, help="input size (square), px")
    p.add_argument("--num-classes", type=int, default=80, help="iteration: classes of the random targets")
    p.add_argument("--repeats", type=int, default=5, help="iteration: timed rounds")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (iteration)")
    p.add_argument(
        "--data-repeats", type=int, default=15, help="data: timed rounds (cheap; many steady the median)"
    )
    p.add_argument("--samples", type=int, default=40, help="data: samples per timed round")
    p.add_argument("--images", type=int, default=208, help="generated training images")
    p.add_argument("--epochs", type=int, default=3, help="end-to-end: epochs per run (the first is left out)")
    p.add_argument("--e2e-batch", type=int, default=16)
    p.add_argument("--e2e-repeats", type=int, default=2, help="end-to-end: runs per side")
    p.add_argument("--e2e-compile-repeats", type=int, default=0, help="end-to-end: runs of ours --compile")
    p.add_argument("--e2e-bf16", action="store_true", help="end-to-end: also runs of ours --bf16, alternated")
    p.add_argument("--compile-backend", default="inductor", help="end-to-end: backend of the --compile runs")
    p.add_argument("--workers", type=int, default=2, help="end-to-end, evaluation: loader workers per side")
    p.add_argument("--inference-images", type=int, default=64, help="inference: generated validation images")
    p.add_argument("--inference-size", type=int, default=None, help="inference: test size (default nano's)")
    p.add_argument("--inference-batch", type=int, default=16, help="inference: batch B of both evaluations")
    p.add_argument("--inference-repeats", type=int, default=3, help="inference: timed rounds")
    p.add_argument(
        "--inference-weights",
        default=str(WEIGHTS) if WEIGHTS.is_file() else None,
        help="inference: checkpoint in official's layout (default the COCO nano in ../shared/weights if "
        "there, else official's random initialisation)",
    )
    p.add_argument("--eval-images", type=int, default=500, help="eval-process: generated validation images")
    p.add_argument("--eval-repeats", type=int, default=3, help="eval-process: processes per side")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads per side")
    p.add_argument("--out", default="YOLOX_outputs/vs_yolox")
    args = p.parse_args(argv)
    require_official_yolox("vs-yolox")
    import yolox

    device = torch.device(args.device)
    from yolox_fast.utils import amp

    amp_dtype = amp.amp_dtype(device, fp16=args.fp16)
    out = Path(args.out).resolve()
    dataset_json = make_fidelity_set(out / f"data_{args.images}", args.images, 16, args.size)
    root = dataset_json.parent
    print(
        f"yolox_fast vs official YOLOX {yolox.__version__}: yolox-nano at {args.size} px, "
        f"{setting(device, amp_dtype)}"
    )
    if "iteration" in args.only:
        rows, flops_line = measure_iteration(args, device, amp_dtype, out, dataset_json)
        print(f"\ntraining iteration, data excluded (median of {args.repeats} alternating repeats)")
        print(flops_line)
        headers = ["batch", "side", "s/iter", "img/s", "range", "vs official", "trainer overhead", "GFLOP/s",
                   "of peak"]  # fmt: skip
        print(tabulate(rows, headers=headers, tablefmt="github"))
    if "data" in args.only:
        rows = measure_data(args, root)
        print(f"\ndata pipeline, CPU ms per training sample (mosaic, affine, HSV, flip; {len(CLASS_NAMES)} "
              f"classes; median of {args.data_repeats} rounds of {args.samples} samples)")  # fmt: skip
        print(tabulate(rows, headers=["side", "CPU ms/sample", "range", "less CPU than official"],
                       tablefmt="github"))  # fmt: skip
    if "end-to-end" in args.only:
        rows = measure_end_to_end(args, root, dataset_json, out)
        print(
            f"\nend to end: {args.epochs}-epoch runs at batch {args.e2e_batch}, {args.workers} loader "
            f"workers, {args.threads} torch threads each, epochs 2-{args.epochs} timed; "
            f"median of {args.e2e_repeats}"
        )
        print(tabulate(rows, headers=["side", "img/s", "range", "vs official", "last-epoch loss"],
                       tablefmt="github"))  # fmt: skip
    if "eval-process" in args.only:
        rows, what = measure_eval_process(args, out)
        print(f"\neval process: {what}")
        headers = ["side", "seconds", "range", "img/s", "vs official", "detections", "AP50:95", "AP50"]
        print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    if "inference" in args.only and args.only != ["inference"]:
        print(inference_in_own_process(argv))
    elif "inference" in args.only:
        rows, what = measure_inference(args, device, out)
        print(f"\ninference: {what}")
        # numparse off: tabulate would print an AP of "0.0000" as "0"
        headers = ["task", "side", "batch", "img/s", "range", "vs official", "detections", "AP50:95", "AP50"]
        print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))


def inference_in_own_process(argv: Sequence[str]) -> str:
    """The inference section's table, measured by this benchmark run anew with `--only inference`.

    Both sides evaluate as a user's `tools/eval.py` (or official's) process does, not after the sections
    before it: the iteration section's batch-64 steps leave this process gigabytes of heap, and every
    evaluation forks its loader workers from it and pays copy-on-write faults for the pages it then writes
    (ours 33.2 against 52.0 img/s alone, official 24.6 against 33.1, on 2026-12-05).
    """
    # the last --only replaces the sections given before it
    cmd = tool("benchmark", "vs-yolox", *argv, "--only", "inference")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the inference section failed:\n{done.stderr[-3000:]}")
    return done.stdout[done.stdout.index("\ninference: ") :].rstrip("\n")
