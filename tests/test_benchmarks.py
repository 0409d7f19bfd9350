"""Every benchmark under benchmarks/ runs, at sizes of a few seconds, and prints its figure with the
ratio against its baseline; the ones that need official YOLOX say how to run them and have their data side
tested here (the reference side runs in test_vs_yolox.py). Timings are printed, never asserted."""

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import SUITES, main
from benchmarks.kit import official
from benchmarks.kit.fidelity_data import CLASS_NAMES, make_fidelity_set
from benchmarks.kit.peak import achieved_columns
from benchmarks.suites import fidelity, finetune

REPO = Path(__file__).resolve().parents[1]


def run(capsys, *argv: str) -> str:
    """`python -m benchmarks argv...` in this process; its printed output."""
    main(list(argv))
    return capsys.readouterr().out


@pytest.mark.parametrize("command", [["-m", "benchmarks"], [str(REPO / "tools" / "benchmark.py")]])
def test_the_dispatcher_lists_every_suite_with_what_it_measures(command, tmp_path):
    """`python -m benchmarks` (from the repository root) and `tools/benchmark.py` (from anywhere): -h lists
    each suite on a line of its own; without a suite, the same and exit status 2."""
    cwd = REPO if command[0] == "-m" else tmp_path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for flags, status in ((["--help"], 0), ([], 2)):
        done = subprocess.run([sys.executable, *command, *flags], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == status, done.stdout + done.stderr
        rows = [line.split() for line in done.stdout.split("\nsuites:\n")[1].splitlines()[: len(SUITES)]]
        assert [row[0] for row in rows] == list(SUITES) and all(len(row) > 3 for row in rows), done.stdout


def test_simota_benchmark_prints_the_ratio_to_the_reference(capsys):
    out = run(
        capsys, "simota", "-n", "2", "--sizes", "128", "--classes", "4", "--repeats", "1", "--threads", "1"
    )
    assert re.search(r"\d+\.\d+x", out), out


def test_train_benchmark_prints_both_assigners(capsys):
    out = run(capsys, "train", "--batch-sizes", "2", "--size", "64", "--iters", "1", "--warmup", "0",
              "--peak-repeats", "1")  # fmt: skip
    assert "batched" in out and "reference" in out, out
    assert re.search(r"peak measured in this run: \d+ GFLOP/s", out), out
    assert re.search(r"\d+\.\d+ GFLOPs per image per step", out), out
    assert len(re.findall(r"\d+\.\d+% +\|$", out, re.M)) == 2, out  # "of peak", one per assigner


def test_workers_benchmark_times_both_worker_priorities(capsys, tmp_path):
    """`ab workers`, which `workers` names (the stem and allocator tests use those names)."""
    out = run(capsys, "ab", "workers", "--size", "64", "--batch", "2", "--workers", "1", "--images", "8",
              "--steps", "1", "--repeats", "1", "--out", str(tmp_path))  # fmt: skip
    assert re.search(r"^\| nice 0 +\| \d+\.\d+ +\|.*\| 1\.00x +\|$", out, re.M), out
    assert re.search(r"^\| nice 19 +\| \d+\.\d+ +\|.*\| \d+\.\d+x +\|$", out, re.M), out


def test_allocator_benchmark_runs_both_sides_in_their_own_processes(capsys, tmp_path):
    out = run(capsys, "allocator", "--size", "64", "--images", "4", "--batch", "2", "--workers", "1",
              "--rounds", "1", "--repeats", "1", "--out", str(tmp_path))  # fmt: skip
    for task in ("demo, -b 1", "demo, -b 2", "evaluation, -b 2, 0 workers", "evaluation, -b 2, 1 workers"):
        assert re.search(rf"^\| {re.escape(task)} +\| default +\|.*\| 1\.00x +\|$", out, re.M), out
        assert re.search(rf"^\| {re.escape(task)} +\| kept +\| \d+\.\d+ +\|.*\| \d+\.\d+x +\|$", out, re.M), (
            out
        )


def test_stem_benchmark_times_both_stems_on_the_same_weights(capsys):
    out = run(capsys, "stem", "--batch", "2", "--infer-size", "64", "--train-size", "64", "--iters", "1",
              "--repeats", "1")  # fmt: skip
    for what in ("stem, inference", "model, inference", "stem, training", "model, training step"):
        assert re.search(
            rf"^\| {re.escape(what)} +\| phases, then conv +\|.*\| 1\.00x +\| +\|$", out, re.M
        ), out
        strided = re.search(
            rf"^\| {re.escape(what)} +\| strided conv +\| \d+\.\d +\|.*\| \d+\.\d+x +\| (.*)\|$", out, re.M
        )
        assert strided, out
        if what != "model, inference":  # the same sums in another order: float rounding apart
            assert float(strided.group(1)) < 1e-5, out


def test_demo_benchmark_prints_images_per_second_per_batch_size(capsys):
    out = run(capsys, "demo", "--tsize", "64", "--batch-sizes", "1", "2", "--images", "2", "--rounds", "1",
              "--no-channels-last")  # fmt: skip
    assert "img/s" in out or "images/s" in out, out
    assert "peak measured in this run" in out and "of peak" in out, out


def test_eval_benchmark_scores_with_both_libraries(capsys):
    out = run(
        capsys, "eval", "--images", "20", "--boxes", "3", "--dets", "5", "--classes", "3", "--repeats", "1"
    )
    assert "pycocotools" in out, out


def test_data_benchmark_prints_the_cache_ratio(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOX_DATADIR", str(tmp_path))
    out = run(capsys, "data", "--sizes", "64", "--images", "8", "--image-size", "64", "--samples", "4",
              "--rounds", "1", "--warmup", "1", "--workers", "1", "--batch", "2")  # fmt: skip
    assert re.search(r"\d+\.\d+x", out), out


@pytest.mark.slow
def test_deploy_benchmark_scores_and_times_every_format_against_eager(capsys, tiny_shapes_coco, tmp_path):
    import torch

    from yolox_fast.exp import get_exp

    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = 6
    ckpt = tmp_path / "nano.pth"
    torch.save({"model": exp.get_model().state_dict()}, ckpt)
    out = run(capsys, "deploy", "-n", "yolox-nano", "-c", str(ckpt), "--runs", "1", "--rounds", "1",
              "--warmup", "0", "--calib-images", "8", "--out", str(tmp_path / "files"),
              "dataset", tiny_shapes_coco["config"], "test_size", "(96,96)", "num_classes", "6",
              "data_num_workers", "0")  # fmt: skip
    rows = [
        line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "format" not in line
    ]
    table = {(r[0].strip(), r[1].strip()): [c.strip() for c in r[2:]] for r in rows}
    assert list(table) == [("pytorch", "fp32"), ("torchscript", "fp32"), ("onnx", "fp32"), ("onnx", "int8"),
                           ("onnx", "fp32+nms"), ("openvino", "fp32"), ("openvino", "fp16"),
                           ("openvino", "int8"), ("openvino", "fp32+nms")]  # fmt: skip
    assert table[("pytorch", "fp32")][5] == "1.00x" and table[("pytorch", "fp32")][7] == "1.00x"
    for (fmt, precision), cells in table.items():
        assert re.fullmatch(r"\d\.\d{4}", cells[1]) and re.fullmatch(r"\d+\.\d+x", cells[7]), (fmt, cells)
        if precision == "fp32":  # fp32 exports score the checkpoint's AP to the printed digit
            assert cells[1:3] == table[("pytorch", "fp32")][1:3], (fmt, cells)
    assert "INT8 calibrated on 8 training images" in out
    assert (tmp_path / "files" / "yolox_nano_int8.xml").is_file()


def test_the_benchmarks_that_need_official_yolox_say_how_to_run_them(capsys):
    try:
        import yolox  # noqa: F401 -- this environment is the reference one
    except ImportError:
        pass
    else:
        pytest.skip("official YOLOX is importable here: test_vs_yolox.py runs these benchmarks")
    for suite in ("finetune", "fidelity", "vs-yolox"):
        with pytest.raises(SystemExit) as stop:
            official.require_official_yolox(suite)
        assert f"$(tools/setup_yolox_reference.sh) tools/benchmark.py {suite}" in str(stop.value)


def test_finetune_benchmark_gives_official_the_boxes_ours_reads(tiny_shapes_voc, tmp_path):
    """Official YOLOX reads COCO only: the benchmark writes the images (linked) and boxes yolox_fast reads
    from any layout in official's layout, the train split cut to whole batches."""
    names, train, val = finetune.read_set(tiny_shapes_voc["config"], batch=5)
    assert len(train) == tiny_shapes_voc["num_train"] // 5 * 5 and len(val) == tiny_shapes_voc["num_val"]
    root = tmp_path / "official"
    finetune.write_official_layout(root, names, train, val)
    data = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    assert [c["name"] for c in data["categories"]] == list(names)
    assert len(data["images"]) == len(train)
    first = data["images"][0]
    assert (root / "train2017" / first["file_name"]).resolve() == Path(train[0].file).resolve()
    boxes = [a["bbox"] for a in data["annotations"] if a["image_id"] == first["id"]]
    x1, y1, x2, y2 = train[0].boxes[0].tolist()
    assert boxes[0] == pytest.approx([x1, y1, x2 - x1, y2 - y1])
    fields = finetune.recipe(finetune_args(), seed=3, num_classes=len(names))
    assert fields["num_classes"] == len(names) and fields["seed"] == 3 and fields["enable_mixup"] is False


def test_finetune_tiled_variant_keeps_every_photo_and_box(tiny_shapes_voc, tmp_path):
    """--tiled 2: as many tiled images as photos per split, each photo once per cell position,
    every box of the split's photos carried over, scaled into its cell."""
    names, train, val = finetune.read_set(tiny_shapes_voc["config"], batch=1)
    root = finetune.tiled_set(tmp_path, names, train, val, grid=2)
    tiled_names, tiled_train, tiled_val = finetune.read_set(str(root), batch=1)
    assert tuple(tiled_names) == tuple(names)
    for photos, tiled in ((train, tiled_train), (val, tiled_val)):
        assert len(tiled) == len(photos)
        assert sum(len(r.boxes) for r in tiled) == 4 * sum(len(r.boxes) for r in photos)
        assert all((r.width, r.height) == (512, 512) for r in tiled)
        assert all(((r.boxes >= 0) & (r.boxes <= 512)).all() for r in tiled)
    # a tiled image's boxes lie inside its cells: no box crosses the middle lines
    for r in tiled_train:
        x1, y1, x2, y2 = r.boxes.T
        assert not (((x1 < 256) & (x2 > 256)) | ((y1 < 256) & (y2 > 256))).any()


def finetune_args():
    import argparse

    return argparse.Namespace(
        size=416, mosaic_prob=1.0, mosaic_scale=[0.5, 1.5], degrees=10.0, translate=0.1, shear=2.0,
        warmup_epochs=1, no_aug_epochs=2, epochs=15, basic_lr_per_img=0.01 / 64, min_lr_ratio=0.05,
        eval_interval=1, workers=1,
    )  # fmt: skip


def write_finetune_results(path: Path, seeds, rows, size: int = 416) -> Path:
    """A results.json as the finetune benchmark saves it: AP50:95 0.1 * (seed + 1) on epochs 1 and 2 for
    every row, ours 0.01 ahead; AP50 twice that."""
    args = {"seeds": list(seeds), "rows": list(rows), "out": str(path.parent), "parallel": 2, "size": size,
            "epochs": 2, "tiled": 3, "ours_opts": [], "example": False, "job": None}  # fmt: skip

    def evals(row: str, seed: int) -> dict:
        ap = 0.1 * (seed + 1) + (0.01 if row == "ours" else 0.0)
        return {str(e): [ap, 2 * ap] for e in (1, 2)}

    results = {row: {str(seed): {"evals": evals(row, seed)} for seed in seeds} for row in rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": args, "results": results, "seconds": 1.0}))
    return path


def test_finetune_report_joins_runs_of_more_seeds_and_refuses_another_recipe(tmp_path):
    """`tools/benchmark.py finetune --report A B`, as typed after a second run of more seeds into another
    --out: one table over the seeds of both, ours' standing over them; a file of another recipe is refused."""
    first = write_finetune_results(tmp_path / "a" / "results.json", [0, 1], ["official", "ours"])
    more = write_finetune_results(
        tmp_path / "b" / "results.json", [2], ["official", "official-later", "ours"]
    )
    cmd = [
        sys.executable,
        str(REPO / "tools" / "benchmark.py"),
        "finetune",
        "--report",
        str(first),
        str(more),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "seeds per row: official 3, ours 3, official-later 1" in out
    assert "over the seeds each row has (0 1 2)" in out
    # official's AP50:95 over seeds 0 1 2: 0.1, 0.2, 0.3; ours 0.01 ahead at both epochs
    assert "0.200 [0.100-0.300]" in out and "0.210 [0.110-0.310]" in out
    assert (
        "ours vs official: AP50 level or ahead at 2/2 epochs, +0.020 at 2; AP50:95 level or ahead at 2/2 "
        in out
    )
    # a row run on fewer seeds is compared on the seeds both have
    assert "ours vs official-later (seeds 2): AP50 level or ahead at 2/2 epochs, +0.020 at 2" in out
    other = write_finetune_results(tmp_path / "c" / "results.json", [3], ["official", "ours"], size=320)
    proc = subprocess.run([*cmd, str(other)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0
    assert f"{other} ran another recipe or data than {first} (size): not joined" in proc.stderr


def test_fidelity_tables_show_mean_and_range_over_seeds(tmp_path):
    desc = make_fidelity_set(tmp_path / "set", num_train=4, num_val=2, size=64)
    assert json.loads(desc.read_text())["class_names"] == list(CLASS_NAMES)
    results = {
        s: {side: {"evals": {5: (0.1 * s, 0.2 * s)}, "losses": {5: 1.0}} for side in ("official", "ours")}
        for s in (1, 2)
    }
    text = fidelity.tables(results, [1, 2], ["official", "ours"])
    assert "0.300 [0.200-0.400]" in text and "mean [min-max] over seeds 1 2" in text


def test_every_module_of_the_package_and_the_tools_imports():
    """The fast tier touches every module: the ones whose work needs official YOLOX or a GPU at least
    import (their runs are in test_vs_yolox.py and tools/gpu_check.sh)."""
    import importlib
    import pkgutil

    import benchmarks
    import yolox_fast

    names = [m.name for m in pkgutil.walk_packages(yolox_fast.__path__, "yolox_fast.")]
    names += [m.name for m in pkgutil.walk_packages(benchmarks.__path__, "benchmarks.")]
    for name in names:
        importlib.import_module(name)
    scripts = sorted((REPO / "tools").glob("*.py"))
    for script in scripts:  # their imports; what runs under `if __name__ == "__main__"` does not
        runpy.run_path(str(script), run_name=f"tools_{script.stem}")
    assert "benchmarks.suites.gpu" in names and "yolox_fast.core.trainer" in names
    assert "train" in [script.stem for script in scripts]


def suite_imports(benchmarks: Path = REPO / "benchmarks") -> list[str]:
    """'file:line module' for each import in `benchmarks` of a suite (benchmarks.suites.*, relative imports
    made absolute) by a suite other than itself or by the kit, read with `ast` (imports inside functions
    count); the suites share code through benchmarks.kit only."""
    from test_layering import imported_modules

    found = []
    for path in sorted(benchmarks.rglob("*.py")):
        own = ".".join(path.relative_to(benchmarks.parent).with_suffix("").parts)
        for line, module in imported_modules(path, benchmarks):
            names = module.split(".")
            if names[:2] == ["benchmarks", "suites"] and len(names) > 2 and ".".join(names[:3]) != own:
                found.append(f"{path.relative_to(benchmarks)}:{line} {module}")
    return sorted(set(found))


def test_no_suite_imports_another_and_the_kit_imports_none(tmp_path):
    assert suite_imports() == []
    # the check sees what it is for: a suite importing another, absolutely or relatively, or the kit a suite
    copy = tmp_path / "benchmarks"
    shutil.copytree(REPO / "benchmarks", copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "suites" / "train.py", "a") as f:
        f.write("\n\ndef f():\n    from .simota import run_budget\n")
    with open(copy / "kit" / "steps.py", "a") as f:
        f.write("\nimport benchmarks.suites.ab\n")
    assert [found.split(" ")[1] for found in suite_imports(copy)] == [
        "benchmarks.suites.ab", "benchmarks.suites.simota", "benchmarks.suites.simota.run_budget"
    ]  # fmt: skip


def test_scale_set_is_coco_shaped_and_reads_back_box_for_box(tmp_path):
    from benchmarks.suites.scale import COCO_IDS, make_coco_set
    from yolox_fast.data.datasets.coco import COCODataset

    ann = make_coco_set(tmp_path, "train2017", 200, seed=3)
    data = json.loads(ann.read_text())
    assert len(data["images"]) == 200 and [c["id"] for c in data["categories"]] == list(COCO_IDS)
    anns = data["annotations"]
    assert 4 < len(anns) / 200 < 11  # COCO's 7.3 boxes per image
    assert any(a["iscrowd"] for a in anns) and all(a["segmentation"] for a in anns)
    first = data["images"][0]
    assert (tmp_path / "train2017" / first["file_name"]).stat().st_nlink > 1  # a link into the pool
    ds = COCODataset(str(tmp_path), "train2017", str(ann), index_dir=str(tmp_path / "cache"))
    assert sum(len(r.boxes) for r in ds.records) == sum(1 for a in anns if not a["iscrowd"])


@pytest.mark.slow
def test_scale_benchmark_prints_our_figures(capsys, tmp_path):
    out = run(capsys, "scale", "--sides", "ours", "--sizes", "120", "--iters", "11", "--workers", "1",
              "--batch", "2", "--eval-images", "20", "--eval-dets", "30",
              "--work", str(tmp_path))  # fmt: skip
    number = r"-?\d+(\.\d+)?"
    assert re.search(rf"^120 ours +{number} +{number} +{number} +{number} s, \+\d+ MiB", out, re.M), out
    assert re.search(rf"^30 ours +{number} +{number} +0\.\d+$", out, re.M), out


def test_achieved_columns_keep_three_significant_digits_when_they_end_in_zeros():
    """A share of exactly 6% printed as a bare "6%" beside "5.7%" (a run of the suite met it)."""
    peak = {"peak": 100e9}
    assert achieved_columns(6e9, 1.0, peak) == ["6.00", "6.00%"]
    assert achieved_columns(5.7e9, 1.0, peak)[1] == "5.70%"
    assert achieved_columns(1.234e7, 1.0, peak)[1] == "0.0123%"
    assert achieved_columns(99.96e9, 1.0, peak)[1] == "100%"
    assert achieved_columns(250e9, 1.0, peak)[0] == "250"
