"""yolox_fast against official YOLOX 0.3.0, piece by piece (loss and gradients, lr, EMA, when mosaic
closes, augmentation, what the model sees, evaluation).

The comparisons run under the reference python, which has official YOLOX installed
(`tools/setup_yolox_reference.sh` makes it at .venv-yolox/; YOLOX_REFERENCE_PYTHON points elsewhere):
tests/yolox_reference/run_all.py computes both sides in one process and prints JSON; the tests here
assert on it. Where yolox_fast differs from 0.3.0 the test says so in its name and pins both sides'
behaviour, so a change on either side shows up here.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "yolox_reference"

pytestmark = pytest.mark.slow


def reference_python() -> str | None:
    """$YOLOX_REFERENCE_PYTHON, else <repo>/.venv-yolox/bin/python if it exists, else None."""
    configured = os.environ.get("YOLOX_REFERENCE_PYTHON")
    if configured:
        if not os.access(configured, os.X_OK):
            pytest.fail(f"YOLOX_REFERENCE_PYTHON={configured} is not an executable python")
        return configured
    default = REPO / ".venv-yolox" / "bin" / "python"
    return str(default) if default.exists() else None


@pytest.fixture(scope="module")
def reference() -> dict:
    python = reference_python()
    if python is None:
        pytest.skip(
            "no official YOLOX 0.3.0 reference environment: run tools/setup_yolox_reference.sh "
            "(or set YOLOX_REFERENCE_PYTHON to a python that has yolox 0.3.0 installed)"
        )
    # the scripts import the benchmarks' shared pieces (`benchmarks.kit`) as well as yolox_fast
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(
        [python, str(SCRIPTS / "run_all.py")], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"run_all.py failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def section(reference: dict, name: str) -> dict:
    result = reference[name]
    if "error" in result:
        pytest.fail(f"section {name} raised:\n{result['error']}")
    return result


# --------------------------------------------------------------------------- (a) model, loss, optimizer
def test_nano_has_official_state_dict_and_initialisation(reference):
    result = section(reference, "loss_grad")
    assert result["state_dict_same_keys_in_order"]
    # the same torch seed builds the same weights: both sides of a seeded comparison start equal
    assert result["init_same_seed_max_abs_diff"] == 0.0


def test_every_zoo_size_has_official_state_dict_and_initialisation(reference):
    """nano, tiny, s, m, l, x: the same keys in order and shapes, the same weights from the same seed."""
    result = {k: v for k, v in section(reference, "zoo_init").items() if k != "seconds"}
    assert sorted(result) == sorted(f"yolox-{n}" for n in ("nano", "tiny", "s", "m", "l", "x"))
    for name, row in result.items():
        assert row["same_keys_in_order_and_shapes"], name
        assert row["init_max_abs_diff"] == 0.0, name


def test_optimizer_parameter_groups_match_official(reference):
    result = section(reference, "loss_grad")
    assert result["optimizer_groups_equal"], (
        result["optimizer_group_sizes"],
        result["optimizer_group_sizes_ours"],
    )


@pytest.mark.parametrize("step", ["no_l1", "l1"])
def test_loss_and_gradients_match_official(reference, step):
    """Same weights, same batch: yolox_fast's batched SimOTA (0.3.0's rule, the default), head and loss
    give official's losses and gradients (targets, IoU/obj/cls/L1 terms, normalisation). With the stem
    computed as official writes it, op for op, to fp32 rounding; as it runs (one strided conv of the image),
    the stem's output rounds differently (~5e-7), which this freshly initialised network, its BatchNorms in
    training mode on 4 images, amplifies about a hundredfold in the gradients (2e-4 on the development
    CPU)."""
    steps = section(reference, "loss_grad")["steps"][step]
    for name, grad_global, grad_max in (("ours_phases_stem", 1e-4, 1e-3), ("ours", 2e-3, 1e-2)):
        run = steps[name]
        assert run["same_grad_tensors"]
        assert run["loss_max_rel_diff"] <= 1e-5, (name, run)
        assert run["grad_global_rel_diff"] <= grad_global, (name, run)
        assert run["grad_max_rel_diff"] <= grad_max, (name, run)


def test_the_later_simota_rule_is_a_switch_that_differs_from_0_3_0(reference):
    """`simota_box_prior False, simota_center_radius 1.5` is the SimOTA of YOLOX after 0.3.0
    (candidates within 1.5 strides of a GT centre only): on the same batch its losses differ."""
    steps = section(reference, "loss_grad")["steps"]
    for step in ("no_l1", "l1"):
        assert steps[step]["ours_later_rule"]["loss_max_rel_diff"] > 1e-3
        assert steps[step]["ours_later_rule"]["grad_global_rel_diff"] > 1e-2


# --------------------------------------------------------------------------- (b) lr, (c) EMA
def lrs(run: dict) -> list[float]:
    return [step["lr"][0] for step in run["steps"]]


def test_trainer_steps_from_a_finetuning_start_are_officials(reference):
    """The whole training side at once, as `tools/train.py -c FOLDED_WEIGHTS` builds it (refit, class layer,
    parameter groups, lr, EMA, channels-last, train_one_iter), against official's loop on the batches our
    loader gives: the same start; free-running, the same losses until SimOTA's discrete choices part on
    the last bits of the float sums; given the same state before each step (warmup, mid-run, without mosaic
    and with L1), the same lr, L1 switch, loss, update, momentum, EMA and BN statistics. The update
    tolerance is the fp32 rounding of two orders of summation (channels-last, batched assignment; up to
    4e-3 here), far below what momentum 0.85 for 0.9 shows (0.10); a loss weight shows in the loss, the lr is
    compared exactly. The EMA decay and weight decay barely move a step this early: their own tests compare
    them (test_ema_updates_and_decay_match_official, test_optimizer_parameter_groups_match_official)."""
    result = section(reference, "trainer_steps")
    assert result["start"] == 0.0  # the refitted file official loads is the Trainer's own refit
    free = result["free"]
    assert [s["lr_ours"] for s in free] == pytest.approx([s["lr_official"] for s in free], rel=1e-12)
    for s in free[:2]:  # the first step has lr 0: the second starts from the same weights too
        assert s["loss_ours"] == pytest.approx(s["loss_official"], rel=5e-5), s
    steps = result["synchronised"]
    assert any(s["use_l1_official"] for s in steps) and not steps[0]["use_l1_official"]
    for s in steps:
        assert s["lr_ours"] == pytest.approx(s["lr_official"], rel=1e-12, abs=1e-15), s
        assert s["use_l1_ours"] == s["use_l1_official"], s
        assert s["loss_ours"] == pytest.approx(s["loss_official"], rel=5e-5), s
        assert s["momentum"] <= 2e-2 and s["bn_stats"] <= 1e-4, s
        assert s["update"] is None or s["update"] <= 2e-2, s
        assert s["ema_update"] is None or s["ema_update"] <= 2e-2, s
    assert sum(s["update"] is not None for s in steps) >= len(steps) - 1  # only the lr-0 step moves nothing


def test_every_step_uses_the_official_lr_also_across_resumes(reference):
    for run in section(reference, "schedule")["runs"]:
        official = lrs(run["official"])
        # official sets the lr after each step for the next: step k runs at update_lr(k), step 0 at
        # the optimizer's initial lr (warmup_lr, which is update_lr(0))
        assert official == pytest.approx(run["update_lr_of_step_index"], rel=1e-12, abs=1e-15)
        assert lrs(run["official_resumed"]) == official
        for name in ("ours", "ours_resumed", "ours_resumed_mid_epoch"):
            assert lrs(run[name]) == pytest.approx(official, rel=1e-12, abs=1e-15), name
        for name in ("official", "ours"):
            assert all(len(set(step["lr"])) == 1 for step in run[name]["steps"])  # one lr for all groups


def test_ema_updates_and_decay_match_official(reference):
    for run in section(reference, "schedule")["runs"]:
        for name in ("ours", "ours_resumed", "ours_resumed_mid_epoch", "official_resumed"):
            official = run["official"]["steps"]
            assert [s["ema_updates_before"] for s in run[name]["steps"]] == [
                s["ema_updates_before"] for s in official
            ]
            assert [s["ema_decay_of_update"] for s in run[name]["steps"]] == pytest.approx(
                [s["ema_decay_of_update"] for s in official], rel=1e-12
            )
        # same lr, same EMA: the same weights at the end (EMA up to fp32 rounding of lerp vs mul-add)
        assert run["final_raw_max_rel_diff"] <= 1e-6
        assert run["final_ema_max_rel_diff"] <= 1e-5


def test_resume_continues_exactly_where_official_restarts_from_the_ema_weights(reference):
    """A known difference: official's resume loads the checkpoint's "model" (the EMA weights) into the
    trained model; yolox_fast resumes the raw weights (epoch boundary or mid-epoch) and lands exactly
    on the uninterrupted run."""
    for run in section(reference, "schedule")["runs"]:
        assert run["ours_resumed_raw_vs_uninterrupted"] == 0.0
        assert run["ours_resumed_mid_epoch_raw_vs_uninterrupted"] == 0.0
        assert run["official_resumed_raw_vs_uninterrupted"] > 1e-3


# --------------------------------------------------------------------------- (d) mosaic close, L1, eval
def first_epoch_where(run: dict, key: str, value: bool, iters: int) -> int:
    """0-based epoch of the first step whose `key` is `value`."""
    return next(i for i, s in enumerate(run["steps"]) if s[key] is value) // iters


def eval_epochs(run: dict) -> list[int]:
    return [e[1] for e in run["events"] if isinstance(e, list) and e[0] == "eval"]


def test_mosaic_closes_and_l1_starts_at_the_epoch_official_closes_them(reference):
    """Both close mosaic (and turn L1 on) at the start of epoch max_epoch - no_aug_epochs - 1 (0-based),
    i.e. no_aug_epochs + 1 epochs without mosaic; the lr's flat tail is no_aug_epochs long in both."""
    for run in section(reference, "schedule")["runs"]:
        cfg = run["config"]
        close = cfg["max_epoch"] - cfg["no_aug_epochs"] - 1
        for name, expected in (("official", close), ("official_resumed", close), ("ours", close)):
            assert first_epoch_where(run[name], "mosaic", False, cfg["iters"]) == expected, name
            assert first_epoch_where(run[name], "use_l1", True, cfg["iters"]) == expected, name
        for name in ("ours_resumed", "ours_resumed_mid_epoch"):
            assert run[name]["steps"] == run["ours"]["steps"]


def test_official_keeps_prefetched_mosaic_batches_after_close(reference):
    """A known difference: official's close_mosaic only flips the batch sampler's flag, and its one
    loader iterator has already handed workers x prefetch_factor (2) batches to its workers with mosaic
    on; yolox_fast restarts its pipeline so the next batch has no mosaic."""
    result = section(reference, "schedule")["loader_close"]
    assert result["mosaic_batches_after_close"] == {"official": 2 * result["workers"], "ours": 0}


def test_eval_epochs_each_side(reference):
    """Both evaluate every eval_interval epochs and, from the epoch mosaic closes, every epoch
    (yolox_fast also the last one, whatever the interval)."""
    for run in section(reference, "schedule")["runs"]:
        cfg = run["config"]
        epochs = range(1, cfg["max_epoch"] + 1)
        close = cfg["max_epoch"] - cfg["no_aug_epochs"]  # 1-based epoch both close mosaic at
        assert eval_epochs(run["official"]) == [
            e for e in epochs if e % cfg["eval_interval"] == 0 or e >= close
        ]
        assert eval_epochs(run["ours"]) == [
            e for e in epochs if e % cfg["eval_interval"] == 0 or e >= close or e == cfg["max_epoch"]
        ]


# --------------------------------------------------------------------------- (e) augmentation
def test_augmentation_steps_match_official_given_the_same_draws(reference):
    result = section(reference, "augment_pieces")
    assert result["hsv"]["max_abs_pixel_diff"] == 0  # lookup tables give the int16 arithmetic's values
    assert result["mirror"] == {"max_abs_pixel_diff": 0, "max_abs_box_diff": 0.0}
    assert result["letterbox"] == {"max_abs_pixel_diff": 0.0, "max_abs_ratio_diff": 0.0}
    assert result["mosaic_placement"]["mismatches"] == 0
    assert result["affine_boxes"]["max_abs_box_diff"] <= 1e-9
    tt = result["train_transform"]
    assert tt["max_abs_pixel_diff"] == 0.0 and tt["max_abs_label_diff_common"] <= 1e-5


def test_affine_pivots_about_the_canvas_centre_where_official_pivots_about_the_origin(reference):
    """A known difference: from the same draws the rotation/scale/shear part is official's, but
    yolox_fast's translation differs by out_size / 2 - L @ canvas_centre (it maps the mosaic canvas's
    centre to the output's centre; official maps the origin to a U(-0.1, 0.1) * size offset)."""
    result = section(reference, "augment_pieces")["affine_matrix"]
    assert result["max_abs_linear_diff"] <= 1e-9
    assert result["max_abs_shift_minus_expected"] <= 1e-6


def test_affine_pivot_origin_reproduces_official_random_affine(reference):
    """`affine_pivot "origin"` is 0.3.0's placement: from the same draws on the same mosaic canvas, official's
    random_affine and ours give the same matrix, the same pixels and the same boxes (ours without the boxes
    of min side <= 1 px, which official's TrainTransform drops afterwards)."""
    result = section(reference, "augment_pieces")["affine_origin"]
    assert result["max_abs_matrix_diff"] <= 1e-12
    assert result["max_abs_pixel_diff"] == 0
    assert result["kept_box_mismatches"] == 0 and result["boxes_kept"] > 0
    assert result["max_abs_box_diff"] <= 1e-9


def test_boxes_of_one_to_two_pixels_both_keep(reference):
    """TrainTransform keeps boxes with min side > 1 px on both sides (yolox_fast's default box filter)."""
    tt = section(reference, "augment_pieces")["train_transform"]
    assert (tt["official_boxes_kept"], tt["ours_boxes_kept"]) == (3, 3)
    assert min(tt["official_min_sides"]) == pytest.approx(1.75)


def test_training_sample_statistics(reference):
    """The figures behind docs/fidelity.md's side-by-side table (same images and settings, 300 samples)."""
    result = section(reference, "data_stats")
    official, ours = result["official"], result["ours"]
    samples = result["settings"]["samples"]
    for side in (official, ours):
        assert side["samples"] == samples
        assert abs(side["mosaic_samples"] / samples - result["settings"]["mosaic_prob"]) < 0.1
        assert side["boxes_per_image"] > 1
        # every box visible in full is kept by both
        assert side["kept_of_visible_whole"] == 1.0
    # both keep slivers: boxes of 2 px or less, most of the boxes cut to under a tenth of their area
    assert ours["share_min_side_le_2px"] > 0 and official["share_min_side_le_2px"] > 0
    assert ours["kept_of_visible_lt_10"] > 0.5 and official["kept_of_visible_lt_10"] > 0.5
    for side in (official, ours):
        assert side["kept_of_visible_10_50"] >= 0.95  # only boxes of <= 1 px are dropped
    # the affine pivot: official's output shows the mosaic centre less often, and more padding
    assert official["centre_visible"] < ours["centre_visible"]
    assert official["tile_cover"] < ours["tile_cover"]


def test_unaugmented_fallback_when_no_box_survives_in_official_only(reference):
    """A known difference: when every box of a sample ends up at most 1 px on a side, 0.3.0's TrainTransform
    falls back to the un-augmented image with all its boxes; yolox_fast keeps the augmented image, without
    boxes."""
    result = section(reference, "differences")["unaugmented_fallback"]
    assert result["official_is_unaugmented"] and result["official_boxes"] == result["boxes_in"] == 2
    assert result["official_box_classes"] == [3.0, 1.0]
    assert result["ours_is_mirrored"] and result["ours_boxes"] == 0


def test_iterations_per_epoch_ceil_in_official_floor_in_ours(reference):
    """A known difference: 0.3.0 runs ceil(N / batch) iterations an epoch (the last batch short), yolox_fast
    floor(N / batch) (whole batches only)."""
    cases = section(reference, "differences")["iterations_per_epoch"]["cases"]
    for case in cases:
        assert case["official"] == math.ceil(case["images"] / case["batch"]), case
        assert case["ours"] == case["images"] // case["batch"], case
    assert any(case["official"] != case["ours"] for case in cases)


def test_multi_scale_random_size_takes_precedence_over_multiscale_range_in_both(reference):
    """nano and tiny set random_size (10, 20): 320-640 px whatever multiscale_range says, also 0, in both; an
    exp without random_size (s) draws input +- multiscale_range * 32, one size at 0. Same seed, same draws."""
    rows = section(reference, "differences")["multiscale"]
    for name, row in rows.items():
        assert row["same_draws"] and row["sizes"] == row["official_sizes"], name
    wide = list(range(320, 641, 32))
    for name in ("yolox-nano", "yolox-tiny"):
        for setting in ("as shipped", "0"):
            assert rows[f"{name}, multiscale_range {setting}"]["sizes"] == wide
    assert rows["yolox-s, multiscale_range as shipped"]["sizes"] == list(range(480, 801, 32))
    assert rows["yolox-s, multiscale_range 0"]["sizes"] == [640]


# --------------------------------------------------------------------------- (f) evaluation
def test_eval_preprocessing_matches_official(reference):
    result = section(reference, "eval_pipeline")["preprocess"]
    assert result["non_square_images"] > 0
    assert result["max_abs_pixel_diff"] == 0.0 and result["info_or_id_mismatches"] == 0
    assert result["category_ids"] == result["official_class_ids"] == [3, 7, 11, 20]


def test_postprocess_matches_official(reference):
    result = section(reference, "eval_pipeline")["postprocess"]
    assert result["count_mismatches"] == 0 and result["max_abs_diff"] == 0.0


def test_evaluation_matches_official(reference):
    result = section(reference, "eval_pipeline")["evaluation"]
    assert (result["test_conf"], result["nmsthre"]) == (
        result["official_test_conf"],
        result["official_nmsthre"],
    )
    assert result["same_rows_per_image"] and result["ours_records"] == result["official_records"] > 0
    assert result["max_abs_row_diff"] <= 1e-3  # px: float32 (official) vs float64 (ours) unscaling
    assert result["ours_ap50_95"] == pytest.approx(result["official_ap50_95"], abs=1e-9)
    assert result["ours_ap50"] == pytest.approx(result["official_ap50"], abs=1e-9)
    assert result["ours_scoring_official_records_ap50_95"] == pytest.approx(
        result["official_ap50_95"], abs=1e-9
    )


def test_fidelity_benchmark_runs_both_sides(tmp_path):
    """`tools/benchmark.py fidelity` as a user runs it (reference python), on a minute setting."""
    python = reference_python()
    if python is None:
        pytest.skip("no official YOLOX 0.3.0 reference environment: run tools/setup_yolox_reference.sh")
    cmd = [python, str(REPO / "tools" / "benchmark.py"), "fidelity", "--seeds", "0", "--num-train", "16",
           "--num-val", "4", "--image-size", "96", "--size", "64", "--batch", "8", "--epochs", "2",
           "--no-aug-epochs", "1", "--workers", "0", "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "mean [min-max] over seeds 0" in proc.stdout
    results = json.loads((tmp_path / "results.json").read_text())["results"]["0"]
    for side in ("official", "ours"):
        assert sorted(results[side]["evals"]) == ["1", "2"], side
        assert sorted(results[side]["losses"]) == ["1", "2"], side
        assert results[side]["iters_per_epoch"] == 2
        assert all(0.0 <= ap <= 1.0 for pair in results[side]["evals"].values() for ap in pair)


def test_finetune_benchmark_runs_every_row_on_a_labelimg_folder(tiny_shapes_voc, tmp_path):
    """`tools/benchmark.py finetune` as a user runs it (reference python) on their own folder of LabelImg
    XML files tiled 2x2 (--tiled), from a checkpoint whose BatchNorm is folded: official 0.3.0 and with its
    later assignment rule from the refitted weights, ours, official from the file, and official's loop fed by
    our loader; two tiny epochs."""
    import shutil

    from test_finetune import save_folded_coco_nano

    python = reference_python()
    if python is None:
        pytest.skip("no official YOLOX 0.3.0 reference environment: run tools/setup_yolox_reference.sh")
    photos = tmp_path / "photos"
    shutil.copytree(Path(tiny_shapes_voc["root"]) / "VOC2007" / "JPEGImages", photos)
    for xml in (Path(tiny_shapes_voc["root"]) / "VOC2007" / "Annotations").glob("*.xml"):
        shutil.copy(xml, photos)
    weights = tmp_path / "coco_nano.pth"
    save_folded_coco_nano(weights)
    cmd = [python, str(REPO / "tools" / "benchmark.py"), "finetune", "--data", str(photos), "--weights",
           str(weights), "--seeds", "0", "--epochs", "2", "--size", "64", "--batch", "4",
           "--warmup-epochs", "1", "--no-aug-epochs", "0", "--workers", "0", "--tiled", "2",
           "--rows", "official", "official-later", "ours", "official-file", "official-our-loader",
           "--out", str(tmp_path / "out")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "same recipe, mean [min-max] over seeds 0" in proc.stdout
    assert "ours vs official-later: AP50 level or ahead at " in proc.stdout
    assert (tmp_path / "out" / "tiled2" / "annotations" / "instances_train2017.json").is_file()
    results = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    assert sorted(results) == ["official", "official-file", "official-later", "official-our-loader", "ours"]
    for row in results.values():
        assert sorted(row["0"]["evals"], key=int) == ["1", "2"]
        assert all(0.0 <= ap <= 1.0 for pair in row["0"]["evals"].values() for ap in pair)


def test_finetune_benchmark_example_against_officials_default_for_the_same_minutes(tiny_shapes_voc, tmp_path):
    """`tools/benchmark.py finetune --rows --example`: the example exp (cut to one tiny epoch by --ours-opts),
    then official's default nano recipe for as long as ours trained; one table row per seed and the mean."""
    from test_finetune import save_folded_coco_nano

    python = reference_python()
    if python is None:
        pytest.skip("no official YOLOX 0.3.0 reference environment: run tools/setup_yolox_reference.sh")
    weights = tmp_path / "coco_nano.pth"
    save_folded_coco_nano(weights)
    cmd = [python, str(REPO / "tools" / "benchmark.py"), "finetune", "--data", tiny_shapes_voc["config"],
           "--weights", str(weights), "--seeds", "0", "--batch", "4", "--workers", "0", "--rows", "--example",
           "--ours-opts", "max_epoch", "1", "input_size", "(64,64)", "test_size", "(64,64)", "random_size",
           "none", "no_aug_epochs", "0", "--out", str(tmp_path / "out")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "vs official's default recipe, same minutes" in proc.stdout
    table = proc.stdout.split("same minutes")[1].splitlines()
    assert [row.split()[0] for row in table[3:5]] == ["0", "mean"], proc.stdout[-1500:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    ours, official = results["example"]["0"], results["official-default"]["0"]
    assert sorted(ours["evals"]) == ["1"]
    assert official["evals"] and all(0.0 <= ap <= 1.0 for pair in official["evals"].values() for ap in pair)
    # official trains until ours' minutes are spent (evaluation included), then stops after that step
    assert official["train_seconds"] >= ours["train_seconds"] * 0.5 and official["steps"] >= 1


def test_setup_script_reuses_a_ready_environment(tmp_path):
    """tools/setup_yolox_reference.sh DIR on a ready environment prints its python and installs nothing."""
    python = reference_python()
    if python is None:
        pytest.skip("no official YOLOX 0.3.0 reference environment: run tools/setup_yolox_reference.sh")
    venv = Path(python).parent.parent
    if not (venv / "pyvenv.cfg").exists():
        pytest.skip(f"{python} is not in a virtual environment the setup script could have made")
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "setup_yolox_reference.sh"), str(venv)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(venv / "bin" / "python")


def boxes_everywhere_nano(path: Path, num_classes: int) -> None:
    """A 4-class nano checkpoint whose every anchor passes the eval and demo thresholds (obj ~0.95, cls ~0.5,
    scores still varying with the image) with a box of twice its stride at its cell's centre: some of them
    cover the ground truth, so an AP computed from them is not 0 = 0."""
    import math

    import torch

    from yolox_fast.exp import get_exp

    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = num_classes
    torch.manual_seed(0)
    state = exp.get_model().state_dict()
    for key, tensor in state.items():
        if key.startswith("head.obj_preds.") and key.endswith(".bias"):
            tensor.fill_(3.0)
        elif key.startswith("head.cls_preds.") and key.endswith(".bias"):
            tensor.zero_()
        elif key.startswith("head.reg_preds.") and key.endswith(".weight"):
            tensor.zero_()
        elif key.startswith("head.reg_preds.") and key.endswith(".bias"):
            tensor.copy_(torch.tensor([0.5, 0.5, math.log(2), math.log(2)]))
    torch.save({"model": state}, path)


def inference_rows(stdout: str) -> dict[tuple[str, str, str], list[str]]:
    """(task, side, batch) -> the other cells of the inference table's rows."""
    table = stdout.split("\ninference: ")[1].splitlines()[3:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table if line.startswith("|")]
    return {tuple(row[:3]): row[3:] for row in cells}


def test_vs_yolox_benchmark_runs_every_section(tmp_path):
    """`tools/benchmark.py vs-yolox` as a user runs it (reference python), at a tiny setting; the inference
    section with the same weights on both sides finds the same boxes and the same AP."""
    python = reference_python()
    if python is None:
        pytest.skip("no official YOLOX 0.3.0 reference environment: run tools/setup_yolox_reference.sh")
    weights = tmp_path / "boxes_everywhere.pth"
    boxes_everywhere_nano(weights, 4)
    # one torch thread: tiny tensors, and a 2-core machine busy elsewhere makes two threads wait on each other
    cmd = [python, str(REPO / "tools" / "benchmark.py"), "vs-yolox", "--batches", "2", "--size", "64",
           "--repeats", "1", "--warmup", "1", "--data-repeats", "1", "--samples", "3", "--images", "16",
           "--epochs", "2", "--e2e-batch", "4", "--e2e-repeats", "1", "--e2e-compile-repeats", "1",
           "--e2e-bf16", "--compile-backend", "eager", "--workers", "0", "--threads", "1",
           "--inference-images", "8", "--inference-size", "64", "--inference-batch", "4",
           "--inference-repeats", "1", "--inference-weights", str(weights), "--eval-images", "8",
           "--eval-repeats", "1", "--out", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for heading in ("training iteration", "data pipeline", "end to end", "inference: 8 generated"):
        assert heading in proc.stdout
    for side in ("| official", "| ours", "ours, trainer"):
        assert side in proc.stdout
    # each training step row: its GFLOP/s and the fraction of the peak measured in the same run
    peak_line = r"GFLOPs per image and step; CPU, \d+ threads, fp32 peak measured in this run: \d+ GFLOP/s"
    assert re.search(peak_line, proc.stdout), proc.stdout[:3000]
    step_rows = re.findall(
        r"^\|\s+2 \| (official|ours|ours, trainer) .*\| +([0-9.]+) +\| ([0-9.]+)% *\|$", proc.stdout, re.M
    )
    assert sorted(side for side, *_ in step_rows) == ["official", "ours", "ours, trainer"], proc.stdout[:3000]
    assert all(float(rate) > 0 and 0 < float(share) < 100 for _, rate, share in step_rows), step_rows
    # the compiled run's row: its rate, range and ratio, and the compile seconds its log gave
    compiled = re.search(
        r"\| ours, --compile \(eager; epoch 1 untimed: \d+ s compiling\)\s*\|\s*([0-9.]+)\s*\|", proc.stdout
    )
    assert compiled and float(compiled[1]) > 0, proc.stdout[-3000:]
    # every end-to-end side, the bf16 one included: a rate, a ratio and its last epoch's finite loss
    e2e = proc.stdout.split("\nend to end:")[1].split("\n\n")[0]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in e2e.splitlines()[3:]]
    e2e_rows = {row[0]: row[1:] for row in cells}
    assert set(e2e_rows) >= {"official", "ours", "ours, --bf16 (autocast; official has none on a CPU)"}, e2e
    for side, (rate, _, ratio, loss) in e2e_rows.items():
        assert float(rate) > 0 and ratio.endswith("x"), side
        assert math.isfinite(float(loss)) and float(loss) > 0, side
    rows = inference_rows(proc.stdout)
    assert sorted(rows) == [("demo", "official", "1"), ("demo", "ours", "1"), ("demo", "ours", "4"),
                            ("evaluation", "official", "4"), ("evaluation", "ours", "4"),
                            ("evaluation", "ours, --no-fuse --no-channels-last", "4")]  # fmt: skip
    for (task, side, _), (rate, spread, ratio, *_) in rows.items():
        assert float(rate) > 0 and "-" in spread and ratio.endswith("x"), (task, side)
        if side == "official":
            assert ratio == "1.00x"
    official = rows[("evaluation", "official", "4")]
    assert int(official[3]) > 0 and float(official[4]) > 0  # detections, AP50:95: not 0 = 0
    for side in ("ours", "ours, --no-fuse --no-channels-last"):
        ours = rows[("evaluation", side, "4")]
        assert ours[3] == official[3], side  # the same boxes
        # AP50:95, AP50 as printed (4 decimals); fused weights round differently, by ~1e-6 in a score
        assert [float(x) for x in ours[4:]] == pytest.approx([float(x) for x in official[4:]], abs=2e-4), side
    demo_boxes = {row[3] for (task, _, _), row in rows.items() if task == "demo"}
    assert len(demo_boxes) == 1 and int(demo_boxes.pop()) > 0  # the same boxes, one at a time or batched
    # one whole eval process per side, both --fuse: a time, a ratio, and the same detections and AP
    table = proc.stdout.split("\neval process: ")[1].split("\n\n")[0].splitlines()[3:]
    cells = {row[0]: row[1:] for row in ([c.strip() for c in line.strip("|").split("|")] for line in table)}
    assert sorted(cells) == ["official", "ours"], table
    assert cells["official"][3] == "1.00x" and float(cells["ours"][0]) > 0
    assert int(cells["ours"][4]) > 0 and cells["ours"][4] == cells["official"][4], cells
    ours_ap, official_ap = ([float(x) for x in cells[side][5:]] for side in ("ours", "official"))
    assert ours_ap == pytest.approx(official_ap, abs=2e-4), cells


def test_gpu_check_runs_against_official_on_a_cpu(tmp_path):
    """tools/gpu_check.sh's benchmark, tiny and on the CPU, with official YOLOX's columns."""
    python = reference_python()
    if python is None:
        pytest.skip("no official YOLOX 0.3.0 reference environment: run tools/setup_yolox_reference.sh")
    cmd = [
        python,
        str(REPO / "tools" / "benchmark.py"),
        "gpu",
        "--device",
        "cpu",
        "--small",
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "vs official" in proc.stdout
    for row in ("| iteration", "| grad checkpoint", "| deploy", "| oom retry"):
        assert row in proc.stdout
    train = {cells[0]: cells[1:] for cells in table_rows(proc.stdout) if cells[0].startswith("train.py")}
    assert list(train) == [
        "train.py --fp16, no cache (baseline)", "train.py README: --fp16 --cache",
        "train.py --fp16 under torchrun --nproc_per_node 1", "train.py --fp16 --compile (eager)",
        "train.py --fp16 cpu_amp_dtype fp16",
    ]  # fmt: skip
    for name, (setting, result, _, rate, ratio, _) in train.items():
        assert setting == "yolox-nano -b 4, 16 images, 2 epochs" and result.startswith("ok"), name
        assert rate.endswith("img/s") and ratio.endswith("x"), name
    assert "/dev/shm/" in train["train.py README: --fp16 --cache"][1]  # the ram cache is one shared buffer
    assert re.search(
        r"\d+ graphs compiled in [\d.]+ s, 0 eager fallbacks",
        train["train.py --fp16 --compile (eager)"][1],
    )
    assert re.search(r"loss scale \d", train["train.py --fp16 cpu_amp_dtype fp16"][1])


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the github-format tables in `text`."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| check")
    ]


def test_setup_script_from_inside_a_fresh_venv_sees_that_venv(tmp_path):
    """`python3 -m venv v && . v/bin/activate`, then tools/setup_yolox_reference.sh: the reference environment
    sees the packages installed in `v` (not the base interpreter's) and runs v's torch.

    `v` gets this test's packages (torch and the rest) through a .pth file, as a pip install would put them
    there, and one package installed into it for real with pip, which only `v` has.
    """
    import site

    user = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(user)], check=True, timeout=120)
    user_python = user / "bin" / "python"
    user_site = Path(
        subprocess.check_output(
            [user_python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    ours = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    (user_site / "test_env.pth").write_text(f"import site; list(map(site.addsitedir, {ours!r}))\n")
    wheel = tmp_path / "only_in_user_venv-1.0-py3-none-any.whl"  # a wheel needs no build tools to install
    info = "only_in_user_venv-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("only_in_user_venv/__init__.py", "")
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: only-in-user-venv\nVersion: 1.0\n")
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")
    subprocess.run(
        [user_python, "-m", "pip", "install", "--quiet", "--no-index", str(wheel)], check=True, timeout=300
    )
    activated = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONHOME", "PYTHONPATH")}
    activated.update(VIRTUAL_ENV=str(user), PATH=f"{user / 'bin'}{os.pathsep}{os.environ['PATH']}")
    ref_dir = tmp_path / "ref"
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "setup_yolox_reference.sh"), str(ref_dir)],
        capture_output=True,
        text=True,
        timeout=900,
        env=activated,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ref = proc.stdout.strip().splitlines()[-1]
    assert ref == str(ref_dir / "bin" / "python")
    code = (
        "import json, os, torch, yolox, only_in_user_venv as p; from os.path import realpath; "
        "print(json.dumps([yolox.__version__, realpath(torch.__file__), realpath(p.__file__)]))"
    )
    seen = json.loads(subprocess.check_output([ref, "-c", code], text=True, env=activated))
    import torch

    assert seen[0] == "0.3.0"
    assert seen[1] == os.path.realpath(torch.__file__)
    assert seen[2].startswith(os.path.realpath(user_site))
