"""The GPU check: every GPU figure the docs claim, in one run of a few minutes, one table at the end.

    tools/gpu_check.sh                                   # on a machine with a GPU (sets up the reference)
    $(tools/setup_yolox_reference.sh) tools/benchmark.py gpu            # the same, by hand
    python tools/benchmark.py gpu --device cpu --small                  # the same code, tiny, on a CPU

Rows (each with the baseline measured in the same run):
- assigner: batched `simota_assign` against the per-image reference and official YOLOX 0.3.0's
  `get_assignments` loop, N = 64 and 256 at 416 and 640 px, 80 classes, fp16 autocast; time and peak memory.
- iteration: a yolox-s training step (forward, loss, backward, SGD, EMA) at batch 64/128/256 with fp16
  autocast + loss scaling: ours, official 0.3.0, and ours with the per-image reference assigner; peak
  memory each (targets: >= 1.5x official at 256; peak memory no higher than official's).
- grad checkpoint: peak memory of one yolox-s forward + backward with and without activation checkpointing.
- train.py: short runs of the README's `tools/train.py -f exps/yolox_nano.py -b 256 --fp16 --cache` on
  generated data (-b 4 on --small): the command itself (its ram cache, one /dev/shm buffer), against the
  same without --cache (the baseline of the ratios), under `torchrun --standalone --nproc_per_node 1`, with
  --compile (compile time and graphs from its log; backend eager on --small, inductor otherwise), and on
  a CPU the real fp16 path (`cpu_amp_dtype fp16`: loss scaling, the scale it ends at); on CUDA --fp16 is
  that path already, and the baseline row shows its scale. Exit status, images/s of the second epoch.
- oom retry: the assigner with a budget far above what is free (the GPU filled on purpose): it must
  catch the out-of-memory error, retry in smaller chunks and give the unchunked result.
- deploy: the train.py run's checkpoint exported to TensorRT (fp32, fp16) and fp16 TorchScript with
  tools/export.py, each scored by `tools/eval.py -c FILE` against the checkpoint's own AP and images/s
  (TensorRT needs `pip install "yolox_fast[tensorrt]"`; the first runs of this path are here).
Official columns are left out when official YOLOX is not importable.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from loguru import logger
from tabulate import tabulate

from benchmarks.kit.assigner import official_assigner, run_table, table_headers
from benchmarks.kit.commands import REPO, STEP_LINE, overrides, tool
from benchmarks.kit.fidelity_data import make_fidelity_set
from benchmarks.kit.inputs import make_inputs, random_batch
from benchmarks.kit.measure import ratio, timed
from benchmarks.kit.steps import grad_checkpoint_peak, official_step, ours_step
from yolox_fast.models.simota import simota_assign
from yolox_fast.models.simota_reference import simota_assign_reference
from yolox_fast.utils import amp
from yolox_fast.utils.metric import sync_device

NANO_EXP = REPO / "exps" / "yolox_nano.py"
SECTIONS = ("assigner", "iteration", "grad-checkpoint", "train", "deploy", "oom")
AP_LINE = re.compile(r"AP50:95 (\d\.\d{4})  AP50 (\d\.\d{4})")
SPEED_LINE = re.compile(r"([0-9.]+) images/s")


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")


def iteration_rows(args, device: torch.device, amp_dtype) -> list[list]:
    have_official = official_assigner() is not None
    rows = []
    for batch in args.iter_batches:
        imgs, targets = random_batch(batch, args.iter_size, 80, device)
        torch.manual_seed(0)
        steps = {}
        if have_official:
            model, steps["official"] = official_step(device, 80, amp_dtype, args.model)
            state = model.state_dict()
        else:
            from yolox_fast.exp import get_exp

            state = get_exp(exp_name=args.model).get_model().state_dict()
        _, steps["ours"] = ours_step(device, 80, amp_dtype, state, args.model)
        ref_model, steps["ours, per-image assigner"] = ours_step(device, 80, amp_dtype, state, args.model)
        ref_model.head.loss_fn = dataclasses.replace(ref_model.head.loss_fn, assigner=simota_assign_reference)
        seconds, peaks = {}, {}
        for name, step in steps.items():  # one side at a time: its peak memory is its own
            measure = timed(lambda step=step: step(imgs, targets.clone()), device=device)
            for _ in range(args.warmup):
                measure()
            _peak_reset(device)
            times = [measure() for _ in range(args.repeats)]
            seconds[name], peaks[name] = statistics.median(times), _peak_mib(device)
            steps[name] = None  # free the side before the next is measured
            if device.type == "cuda":
                torch.cuda.empty_cache()
        base = seconds.get("official", seconds["ours, per-image assigner"])
        for name in seconds:
            rows.append([
                "iteration", f"{args.model} batch {batch}", name, f"{seconds[name]:.3f} s",
                f"{batch / seconds[name]:.1f} img/s", f"{base / seconds[name]:.2f}x", f"{peaks[name]:.0f}",
            ])  # fmt: skip
    return rows


def checkpoint_rows(args, device: torch.device, amp_dtype) -> list[list]:
    bench = argparse.Namespace(num_classes=80, size=args.iter_size)
    batch = args.iter_batches[0]
    plain = grad_checkpoint_peak(bench, batch, False, device, amp_dtype, args.model) / 2**20
    ckpt = grad_checkpoint_peak(bench, batch, True, device, amp_dtype, args.model) / 2**20
    kind = "CUDA allocated" if device.type == "cuda" else "CPU resident-set"
    setting = f"{args.model} batch {batch}"
    return [["grad checkpoint", setting, "off", "", "", "1.00x", f"{plain:.0f}"],
            ["grad checkpoint", setting, "on", "", kind, ratio(ckpt, plain), f"{ckpt:.0f}"]]  # fmt: skip


@dataclasses.dataclass
class TrainRun:
    """One `tools/train.py` run of the check: its status text, wall seconds, the images/s of its steps after
    the first epoch (None when it logged none), its log and output folder."""

    status: str
    wall: float
    rate: float | None
    log: str
    run_dir: Path


def train_opts(args) -> dict:
    """The exp overrides of the train section's runs: its generated set (written once, then reused), fixed
    size, 2 epochs."""
    out = Path(args.out).resolve()
    desc = make_fidelity_set(out / "data", args.train_images, 16, args.train_size)
    size = f"({args.train_size},{args.train_size})"
    grid = f"({args.train_size // 32},{args.train_size // 32})"
    return {"dataset": desc, "num_classes": 4, "input_size": size, "test_size": size, "random_size": grid,
            "max_epoch": 2, "warmup_epochs": 1, "no_aug_epochs": 0, "eval_interval": 2, "print_interval": 1,
            "output_dir": out, "data_num_workers": args.workers, "save_history_ckpt": "false"}  # fmt: skip


def _train(args, name: str, flags: list[str], extra: dict | None = None, launcher: list[str] | None = None):
    """`tools/train.py -f exps/yolox_nano.py -b B` (the README's command) with `flags` on the check's
    generated data, 2 epochs; `launcher` replaces `python` (torchrun)."""
    opts = {**train_opts(args), **(extra or {})}
    cmd = tool("train", "-f", NANO_EXP, "-b", args.train_batch, "-l", "none", "-expn", name, *flags,
               *overrides(opts), python=launcher or [sys.executable])  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.train_timeout)
    wall = time.perf_counter() - t0
    later = [float(m[2]) for m in STEP_LINE.finditer(done.stderr) if int(m[1]) > 1]
    rate = len(later) * args.train_batch / sum(later) if later else None
    status = (
        "ok"
        if done.returncode == 0
        else f"FAILED rc {done.returncode}: {done.stderr.strip().splitlines()[-1]}"
    )
    if done.returncode != 0:
        logger.error(done.stderr[-3000:])
    return TrainRun(status, wall, rate, done.stderr, Path(args.out).resolve() / name)


def _scale(run: TrainRun) -> str:
    """The loss scale the run ended with (its latest checkpoint's scaler), or why there is none."""
    ckpt = run.run_dir / "latest_ckpt.pth"
    if not ckpt.is_file():
        return "no checkpoint"
    scaler = torch.load(ckpt, map_location="cpu", weights_only=True).get("scaler") or {}
    return f"loss scale {scaler['scale']:g}" if "scale" in scaler else "no loss scaler (not fp16)"


def _logged(pattern: str, log: str, missing: str) -> str:
    """The last match of `pattern`'s group in a run's log, or `missing`."""
    found = re.findall(pattern, log)
    return found[-1] if found else missing


def train_rows(args, device: torch.device) -> list[list]:
    """`tools/train.py` as users run it: the README's nano command (--fp16 --cache, whose ram cache is one
    /dev/shm buffer), against the same without the cache, under torchrun with 1 process, with --compile,
    and (on a CPU, where --fp16 means bf16) the real fp16 path with loss scaling."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    backend = args.compile_backend
    plain = _train(args, "gpu_check_nocache", ["--fp16"])
    readme = _train(args, "gpu_check", ["--fp16", "--cache", "ram"])  # ram: the bare --cache's meaning
    launched = _train(args, "gpu_check_torchrun", ["--fp16"], launcher=torchrun)
    compiled = _train(args, "gpu_check_compile", ["--fp16", "--compile"], {"compile_backend": backend})
    # (row name, run, what its log or checkpoint shows)
    runs = [
        ("--fp16, no cache (baseline)", plain, _scale(plain) if device.type == "cuda" else ""),
        ("README: --fp16 --cache", readme, _logged(r"ram: (\S+)", readme.log, "no ram cache logged")),
        ("--fp16 under torchrun --nproc_per_node 1", launched, ""),
        (f"--fp16 --compile ({backend})", compiled,
         _logged(r"torch\.compile so far: ([^\n]+)", compiled.log, "no compile stats logged")),
    ]  # fmt: skip
    if device.type != "cuda":  # --fp16 is bf16 on a CPU: the fp16 path with loss scaling on request
        # from scale 1, doubled every 2 clean steps: the few steps of a short run do not all overflow
        fp16_opts = {"cpu_amp_dtype": "fp16", "scaler_init_scale": 1, "scaler_growth_interval": 2}
        fp16 = _train(args, "gpu_check_fp16", ["--fp16"], fp16_opts)
        runs.append(("--fp16 cpu_amp_dtype fp16", fp16, _scale(fp16)))
    setting = f"yolox-nano -b {args.train_batch}, {args.train_images} images, 2 epochs"
    rows = []
    for name, run, detail in runs:
        result = run.status + (f"; {detail}" if detail and run.status == "ok" else "")
        ratio = f"{run.rate / plain.rate:.2f}x" if run.rate and plain.rate else ""
        rate = f"{run.rate:.1f} img/s" if run.rate else "-"
        rows.append([f"train.py {name}", setting, result, f"{run.wall:.0f} s wall", rate, ratio, ""])
    return rows


def _tool(name: str, argv: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(tool(name, *argv), capture_output=True, text=True, timeout=timeout)


def _scored(done: subprocess.CompletedProcess) -> str:
    """'AP50:95 x AP50 y, z images/s' from an eval run, or why it failed."""
    text = done.stdout + done.stderr
    if done.returncode != 0:
        return f"FAILED rc {done.returncode}: {text.strip().splitlines()[-1]}"
    ap, speed = AP_LINE.findall(text), SPEED_LINE.findall(text)
    return f"AP50:95 {ap[-1][0]} AP50 {ap[-1][1]}" + (f", {speed[-1]} img/s" if speed else "")


def deploy_rows(args, device: torch.device) -> list[list]:
    if device.type != "cuda":
        return [["deploy", "-", "n/a on CPU (TensorRT and fp16 TorchScript need CUDA)", "", "", "", ""]]
    ckpt = Path(args.out).resolve() / "gpu_check" / "latest_ckpt.pth"
    if not ckpt.is_file():
        return [["deploy", "-", f"no {ckpt}: the train.py row failed", "", "", "", ""]]
    model = ["-f", str(NANO_EXP), "-c", str(ckpt)]
    opts = overrides({k: v for k, v in train_opts(args).items() if k != "max_epoch"})
    scoring = ["-b", "32", "--conf", "0.001"]
    reference = _scored(_tool("eval", [*model, *scoring, *opts], 600))
    rows = [["deploy", "checkpoint (eval.py)", reference, "", "", "", ""]]
    exports = {
        "tensorrt fp32": ["--format", "tensorrt", "--dynamic", "--batch-size", "32"],
        "tensorrt fp16": ["--format", "tensorrt", "--dynamic", "--batch-size", "32", "--half"],
        "torchscript fp16": ["--format", "torchscript", "--device", "gpu", "--half"],
    }
    for name, flags in exports.items():
        path = Path(args.out).resolve() / f"{name.replace(' ', '_')}.{flags[1].replace('tensorrt', 'engine')}"
        t0 = time.perf_counter()
        done = _tool("export", [*flags, *model, "--output-name", str(path), *opts], 900)
        built = time.perf_counter() - t0
        result = _scored(_tool("eval", ["-c", str(path), *scoring], 600)) if done.returncode == 0 else (
            f"export FAILED: {(done.stdout + done.stderr).strip().splitlines()[-1]}"
        )  # fmt: skip
        rows.append(["deploy", name, result, f"{built:.0f} s export", "", "", ""])
    return rows


def oom_rows(args, device: torch.device) -> list[list]:
    if device.type != "cuda":
        return [["oom retry", "-", "n/a on CPU (no out-of-memory error to catch)", "", "", "", ""]]
    batch = make_inputs(args.oom_images, 640, 80, device=device)
    expected = simota_assign(**batch, max_bytes=2**40)
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info(device)[0]
    filler = torch.empty(max(free - args.oom_leave_mib * 2**20, 0), dtype=torch.uint8, device=device)
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        t0 = time.perf_counter()
        result = simota_assign(**batch, max_bytes=2**40)  # a budget far above what is left
        sync_device(device)
        seconds = time.perf_counter() - t0
    finally:
        logger.remove(sink)
        del filler
    retried = sum("out of GPU memory" in w for w in warnings)
    same = bool(
        torch.equal(result.fg_mask, expected.fg_mask) and torch.equal(result.matched_gt, expected.matched_gt)
    )
    status = (
        f"{retried} retries, result {'equal' if same else 'DIFFERENT'}" if retried else "no OOM was raised"
    )
    return [["oom retry", f"N={args.oom_images}, 640 px, {args.oom_leave_mib} MiB left", status,
             f"{seconds:.2f} s", "", "", ""]]  # fmt: skip


def main(argv) -> None:
    p = argparse.ArgumentParser(prog="benchmark.py gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="tiny sizes: checks that the script runs (CPU test)")
    p.add_argument("--out", default="YOLOX_outputs/gpu_check")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    small = args.small
    args.model = "yolox-nano" if small else "yolox-s"
    args.assign_sizes, args.assign_batches = ([128], [4]) if small else ([416, 640], [64, 256])
    args.iter_batches, args.iter_size = ([2], 128) if small else ([64, 128, 256], 640)
    args.repeats, args.warmup = (1, 1) if small else (5, 2)
    # the README's nano command at its batch of 256 (-b 4 on --small), 8 steps an epoch
    args.train_images, args.train_size, args.train_batch = (16, 64, 4) if small else (2048, 416, 256)
    args.workers, args.train_timeout = (0, 600) if small else (8, 420)
    # inductor takes minutes a graph on a CPU: --small checks the path with dynamo alone (backend eager)
    args.compile_backend = "eager" if small else "inductor"
    args.oom_images, args.oom_leave_mib = 256, 200
    amp_dtype = amp.amp_dtype(device, fp16=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    start = time.perf_counter()

    if "assigner" in args.only:
        assign = run_table(
            args.assign_sizes, args.assign_batches, 80, device, args.repeats, True, 16, None, amp_dtype
        )
        print(f"\nassigner, {where}, fp16 autocast, 80 classes, 5-40 GTs per image")
        print(tabulate(assign, headers=table_headers(official_assigner() is not None), tablefmt="github"))
    sections = {
        "iteration": lambda: iteration_rows(args, device, amp_dtype),
        "grad-checkpoint": lambda: checkpoint_rows(args, device, amp_dtype),
        "train": lambda: train_rows(args, device),
        "deploy": lambda: deploy_rows(args, device),  # exports the train section's checkpoint
        "oom": lambda: oom_rows(args, device),
    }
    rows = [row for name, section in sections.items() if name in args.only for row in section()]
    print(f"\n{where}, {str(amp_dtype).replace('torch.', '')}; {time.perf_counter() - start:.0f} s in all")
    print(tabulate(rows, headers=["check", "setting", "side / result", "time", "rate", "vs baseline",
                                  "peak MiB"], tablefmt="github"))  # fmt: skip
