"""Faults a hostile but realistic user meets, each probed with the tools as typed: what the user sees, and
that nothing is lost (the "What happens when..." list of docs/training.md, row by row). The tools run as the
interpreter runs them, in this process (helpers.run_tool_here: exit code and stderr as a fresh process's);
a kill -9 and the headline command without COCO (its environment, its traceback) take a process of their
own."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ToolRun, run_tool_here

from yolox_fast.utils.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXP = str(REPO / "exps" / "example" / "shapes_nano.py")
TINY = {
    "input_size": "(64,64)",
    "test_size": "(64,64)",
    "random_size": "(2,2)",
    "data_num_workers": "0",
    "max_epoch": "1",
    "no_aug_epochs": "0",
    "warmup_epochs": "0",
    "eval_interval": "1",
    "basic_lr_per_img": "0.002",
    "seed": "0",
    "mosaic_prob": "0.5",  # the quick-start exp has none; these runs keep the mosaic path in play
    "save_eval_report": "false",  # the pictures have tests of their own; here they only cost time
}


def opts(desc: str, out: Path, **overrides) -> list:
    return [
        str(x) for kv in {"dataset": desc, "output_dir": str(out), **TINY, **overrides}.items() for x in kv
    ]


def train(desc: str, out: Path, *flags, **overrides) -> ToolRun:
    return run_tool_here(
        "train", "-f", EXP, "-expn", "run", "-b", "2", "-l", "none", *flags, *opts(desc, out, **overrides)
    )


def last_line(done: ToolRun) -> str:
    return (done.stderr.strip().splitlines() or [""])[-1]


@pytest.fixture
def coco_copy(tiny_shapes_coco, tmp_path):
    """(description path, root, train annotation path) of a writable copy of the tiny COCO set."""
    root = tmp_path / "data"
    shutil.copytree(tiny_shapes_coco["root"], root)
    desc = tmp_path / "data.json"
    cfg = json.loads(Path(tiny_shapes_coco["config"]).read_text())
    desc.write_text(json.dumps({**cfg, "root": str(root)}))
    return desc, root, root / "annotations" / "instances_train2017.json"


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# ---------------------------------------------------------------- bad data: told what and where
@pytest.mark.slow
def test_unknown_category_id_names_the_annotation(coco_copy, tmp_path):
    desc, _, ann = coco_copy
    edit_json(ann, lambda d: d["annotations"][3].update(category_id=99))
    done = train(desc, tmp_path / "out")
    assert done.returncode != 0 and "annotation id 4 has category id 99" in last_line(done)


@pytest.mark.slow
def test_missing_image_names_the_file(coco_copy, tmp_path):
    desc, root, _ = coco_copy
    (root / "train2017" / "000005.jpg").unlink()
    done = train(desc, tmp_path / "out")
    assert (
        done.returncode != 0 and "image file not found" in last_line(done) and "000005.jpg" in last_line(done)
    )


@pytest.mark.slow
def test_annotations_of_no_image_are_named_and_all_of_them_stop_the_run(coco_copy, tmp_path):
    desc, _, ann = coco_copy
    edit_json(ann, lambda d: [a.update(image_id=a["image_id"] + 1000) for a in d["annotations"]])
    done = train(desc, tmp_path / "out")
    assert done.returncode != 0
    assert (
        "name an image_id that no image of the file has (first: annotation id 1 (image_id 1001)"
        in done.stderr
    )
    assert "no usable box left" in last_line(done)
    assert not (tmp_path / "out" / "run" / "latest_ckpt.pth").exists()


@pytest.mark.slow
def test_truncated_annotation_json_names_the_file(coco_copy, tmp_path):
    desc, _, ann = coco_copy
    ann.write_text(ann.read_text()[:5000])
    done = train(desc, tmp_path / "out")
    assert done.returncode != 0 and f"{ann} is not valid JSON" in last_line(done)


@pytest.mark.slow
def test_an_unreadable_first_val_image_is_skipped_by_name_and_the_run_ends_well(coco_copy, tmp_path):
    desc, root, _ = coco_copy
    (root / "val2017" / "000001.jpg").write_bytes(b"not a jpeg")
    done = train(desc, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{root / 'val2017' / '000001.jpg'}: not an image any decoder reads" in done.stderr
    assert (tmp_path / "out" / "run" / "demo.jpg").is_file()  # drawn on the next readable image


# ---------------------------------------------------------------- bad settings: refused at once
@pytest.mark.slow
@pytest.mark.parametrize(
    "key, value, said",
    [
        ("simota_max_bytes", "lots", "cannot set exp key 'simota_max_bytes' to 'lots': expected int | None"),
        ("input_size", "(128,)", "cannot set exp key 'input_size' to '(128,)': expected tuple[int, int]"),
    ],
)
def test_overrides_of_the_wrong_type_or_shape_are_refused_before_any_work(
    coco_copy, tmp_path, key, value, said
):
    desc, _, _ = coco_copy
    started = time.perf_counter()
    done = train(desc, tmp_path / "out", **{key: value})
    assert done.returncode != 0 and said in last_line(done)
    assert not (tmp_path / "out").exists() and time.perf_counter() - started < 60


# ---------------------------------------------------------------- damaged or unsafe checkpoints
def damaged_checkpoints(tmp_path: Path) -> dict:
    from yolox_fast.exp import get_exp
    from yolox_fast.utils.checkpoint import save_checkpoint

    model = get_exp(EXP).get_model()
    good = tmp_path / "good.pth"
    save_checkpoint({"model": model.state_dict()}, good)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    unsafe = tmp_path / "unsafe.pth"
    torch.save({"model": model.state_dict(), "hook": Path("/tmp")}, unsafe)  # an object: code on unpickling
    return {
        "truncated": (truncated, "truncated or corrupt"),
        "unsafe": (unsafe, "weights_only loading refuses"),
    }


@pytest.mark.slow
def test_damaged_and_unsafe_checkpoints_are_refused_on_every_path(coco_copy, tmp_path):
    desc, root, _ = coco_copy
    out = tmp_path / "out"
    (out / "run").mkdir(parents=True)
    for kind, (path, said) in damaged_checkpoints(tmp_path).items():
        latest = out / "run" / "latest_ckpt.pth"
        shutil.copy(path, latest)
        calls = {
            "train -c (fine-tune)": (
                "train",
                "-f",
                EXP,
                "-expn",
                "run2",
                "-b",
                "2",
                "-c",
                path,
                *opts(desc, out),
            ),
            "train --resume": ("train", "-f", EXP, "-expn", "run", "-b", "2", "--resume", *opts(desc, out)),
            "eval -c": ("eval", "-f", EXP, "-c", path, *opts(desc, out)),
            "demo -c": ("demo", "image", "-f", EXP, "-c", path, "--path", root / "val2017", *opts(desc, out)),
            "export -c": (
                "export_onnx",
                "-f",
                EXP,
                "-c",
                path,
                "--output-name",
                tmp_path / "m.onnx",
                *opts(desc, out),
            ),
        }
        if kind == "unsafe":  # every path loads through the one loader the truncated file proves them on
            calls = {where: calls[where] for where in ("train --resume", "demo -c")}
        for where, (name, *args) in calls.items():
            done = run_tool_here(name, *args)
            named = str(latest if "--resume" in args else path)
            assert done.returncode != 0, f"{kind} checkpoint accepted by {where}"
            assert said in last_line(done) and named in last_line(done), (
                f"{kind} / {where}: {last_line(done)}"
            )


# ---------------------------------------------------------------- killed and diverged runs lose nothing
@pytest.mark.slow
def test_kill_9_then_resume_continues_from_the_last_epoch(coco_copy, tmp_path):
    desc, _, _ = coco_copy
    out = tmp_path / "out"
    train_py = str(REPO / "tools" / "train.py")
    cmd = [
        sys.executable,
        train_py,
        "-f",
        EXP,
        "-expn",
        "run",
        "-b",
        "2",
        "-l",
        "none",
        *opts(desc, out, max_epoch=2),
    ]
    latest = out / "run" / "latest_ckpt.pth"
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.time() + 600  # a loaded machine can take minutes to get there
        while time.time() < deadline and not latest.is_file() and proc.poll() is None:
            time.sleep(0.05)
        assert latest.is_file(), "no checkpoint after the first epoch"
        os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: only what is on disk survives
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    saved = load_checkpoint(latest)
    assert saved["start_epoch"] >= 1
    done = run_tool_here("train", "--resume", *cmd[2:])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {latest}: epoch {saved['start_epoch'] + 1}" in done.stderr
    assert load_checkpoint(latest)["start_epoch"] == 2


@pytest.mark.slow
def test_divergence_never_writes_non_finite_weights_and_names_the_good_ones(coco_copy, tmp_path):
    desc, _, _ = coco_copy
    out = tmp_path / "out"
    assert train(desc, out).returncode == 0  # one good epoch
    run = out / "run"
    good = {name: (run / f"{name}_ckpt.pth").read_bytes() for name in ("latest", "best")}
    done = train(desc, out, "--resume", max_epoch=4, basic_lr_per_img=50)  # a learning rate far too high
    assert done.returncode != 0
    assert "non-finite" in done.stderr and "step not applied" in done.stderr
    assert "The last good weights are in" in last_line(done) and str(run / "latest_ckpt.pth") in last_line(
        done
    )
    for name in ("latest", "best"):
        state = load_checkpoint(run / f"{name}_ckpt.pth")
        for key in ("model", "raw_model"):
            assert all(torch.isfinite(t).all() for t in state[key].values() if t.is_floating_point()), name
    assert (run / "best_ckpt.pth").read_bytes() == good["best"]


# ---------------------------------------------------------------- demo and cache
@pytest.mark.slow
def test_demo_on_a_file_that_is_not_a_video_says_so(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    untrained = ["-n", "yolox-nano", "--random-weights", "test_size", "(64,64)", "output_dir", tmp_path]
    done = run_tool_here("demo", "video", *untrained, "--path", notes)
    assert done.returncode != 0 and "notes.txt exists but is not a video OpenCV can read" in last_line(done)


def test_a_refused_cache_is_reported_as_not_used_and_leaves_no_lock(tiny_shapes_coco, tmp_path, monkeypatch):
    from yolox_fast.core import reporting
    from yolox_fast.core.trainer import Trainer
    from yolox_fast.data import cache as cache_mod
    from yolox_fast.exp import get_exp

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(cache_mod, "SHM_DIR", shm)
    monkeypatch.setattr(cache_mod, "free_bytes", lambda mode, folder: (1000, "1000 B free in test"))
    from yolox_fast.tools import train as train_tool

    args = train_tool.parse_args(["-f", EXP, "-expn", "run", "-b", "2", "--cache", "ram", "-l", "none",
                                  *opts(tiny_shapes_coco["config"], tmp_path / "out")])  # fmt: skip
    exp = get_exp(args.exp_file)
    exp.merge(args.opts)
    trainer = Trainer(exp, args)
    trainer.before_train()
    summary = reporting.cache_summary(args.cache, trainer.train_loader.images.cache)
    assert summary.startswith("ram asked for, NOT used")
    assert list(shm.iterdir()) == []


@pytest.mark.slow
def test_the_headline_command_without_coco_says_where_coco_goes_in_one_line(tmp_path):
    """`python tools/train.py -f exps/yolox_nano.py -b 256 --fp16 --cache` on a machine without COCO: one
    `error:` line saying where COCO goes, the YOLOX_DATADIR variable and the no-download quick start; no
    traceback (YOLOX_FAST_DEBUG=1 brings it back)."""
    cmd = [sys.executable, str(REPO / "tools" / "train.py"), "-f", str(REPO / "exps" / "yolox_nano.py"),
           "-b", "256", "--fp16", "--cache"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("YOLOX_DATADIR", "YOLOX_FAST_DEBUG")}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    line = errors[0]
    assert str(tmp_path / "datasets" / "COCO") in line and "YOLOX_DATADIR" in line
    assert "exps/example/shapes_nano.py" in line
    debug = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**env, "YOLOX_FAST_DEBUG": "1"}
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_a_bug_keeps_its_traceback_a_user_error_does_not(capsys, monkeypatch):
    from yolox_fast.core.cli import run_tool

    monkeypatch.delenv("YOLOX_FAST_DEBUG", raising=False)

    def user_error():
        raise FileNotFoundError("checkpoint not found: nope.pth")

    with pytest.raises(SystemExit) as stop:
        run_tool(user_error)
    assert stop.value.code == 1 and capsys.readouterr().err == "error: checkpoint not found: nope.pth\n"

    def bug():
        raise TypeError("unsupported operand")

    with pytest.raises(TypeError):
        run_tool(bug)
