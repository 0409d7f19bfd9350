"""Experiment trackers (core/trackers.py) run for real, offline: `tools/train.py -l tensorboard,mlflow,wandb`
as typed, MLflow into a SQLite store (and once into a real `mlflow server` on localhost), W&B in offline mode;
each run read back with the library's own client or files, then extended with `--resume max_epoch 3`, which
continues the same runs with no step logged twice. A missing package is one error line before any work."""

import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import load_tool
from test_trainer import EXP_FILE, REPO, logged_iterations, tiny_opts

from yolox_fast.core import trackers
from yolox_fast.core.results import COLUMNS, read_results
from yolox_fast.core.trainer import Trainer
from yolox_fast.exp import get_exp
from yolox_fast.utils.checkpoint import load_checkpoint
from yolox_fast.utils.lr_scheduler import LRScheduler

TRAIN = str(REPO / "tools" / "train.py")
STEPS_PER_EPOCH = 6  # 24 images, -b 4


def train(tmp_path: Path, opts: list, *flags, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python tools/train.py -f shapes_nano.py -expn run -b 4 FLAGS OPTS` from `tmp_path` (so that whatever a
    library writes into its working directory stays there)."""
    cmd = [sys.executable, TRAIN, "-f", EXP_FILE, "-expn", "run", "-b", "4", *flags, *opts]
    return subprocess.run(
        cmd, cwd=tmp_path, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600
    )


def offline_env(tmp_path: Path) -> dict:
    """W&B offline, every folder it writes under tmp_path; MLflow into a SQLite file there."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb_data"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }


def wandb_records(path: Path):
    """The records of a W&B run file (`run-<id>.wandb`): a LevelDB-style log of 32 KiB blocks, each record a
    7-byte header (crc32, length, type: full, first, middle, last) and a protobuf `Record` of wandb's own
    schema (wandb 0.31 ships no reader of its own)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, chunks = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += block - pos % block
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        chunks = chunk if kind in (1, 2) else chunks + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            yield record


def wandb_history(path: Path) -> list[dict]:
    import json

    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def test_logger_flag_takes_names_joined_by_commas():
    assert trackers.parse_logger("tensorboard") == ("tensorboard",)
    assert trackers.parse_logger("tensorboard,mlflow") == ("tensorboard", "mlflow")
    assert trackers.parse_logger("none") == ()
    for bad in ("comet", "none,mlflow", ""):
        with pytest.raises(Exception, match="choose tensorboard, wandb, mlflow"):
            trackers.parse_logger(bad)


def test_wandb_and_mlflow_words_are_taken_out_of_the_exp_overrides():
    opts = ["max_epoch", "3", "wandb-project", "p", "wandb-num_eval_imges", "4", "mlflow-run_name", "r"]
    rest, options = trackers.split_options(opts)
    assert rest == ["max_epoch", "3"]
    assert options == {"wandb": {"project": "p", "num_eval_images": "4"}, "mlflow": {"run_name": "r"}}
    args = load_tool("train").parse_args(["-f", EXP_FILE, "-l", "wandb,mlflow", *opts])
    assert args.opts == ["max_epoch", "3"] and args.logger == ("wandb", "mlflow")
    assert args.tracker_options == options


def test_tracker_options_without_their_tracker_or_unknown_are_errors():
    with pytest.raises(
        ValueError, match="wandb-project p: wandb options, but -l is tensorboard: add -l wandb"
    ):
        trackers.check(("tensorboard",), {"wandb": {"project": "p"}, "mlflow": {}})
    with pytest.raises(ValueError, match="unknown MLflow option mlflow-color"):
        trackers.check(("mlflow",), {"wandb": {}, "mlflow": {"color": "red"}})


@pytest.mark.slow
def test_a_missing_package_is_one_error_line_before_anything_starts(tiny_shapes_coco, tmp_path):
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "mlflow.py").write_text(
        "raise ImportError('No module named mlflow (a stand-in for a machine without it)')\n"
    )
    out = train(
        tmp_path,
        tiny_opts(tiny_shapes_coco["config"], tmp_path / "out"),
        "-l",
        "tensorboard,mlflow",
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")]))},
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        'error: -l mlflow needs the mlflow package: pip install "yolox_fast[mlflow]" '
        "(No module named mlflow (a stand-in for a machine without it))"
    )
    assert "Traceback" not in out.stderr and out.stderr.count("error:") == 1
    assert not (tmp_path / "out").exists()  # nothing was built, loaded or written


@pytest.mark.slow
def test_mlflow_params_are_cut_to_its_limit_flattened_and_kept_on_resume(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("YOLOX_MLFLOW_FLATTEN_PARAMS", "true")
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    config = {"long": "x" * 7000, "nested": {"a": 1, "b": {"c": (2, 3)}}, "max_epoch": 2}
    tracker = trackers.MlflowTracker({"experiment_name": "unit"})
    tracker.start(trackers.RunStart(str(tmp_path), "unit", config, first_step=1))
    tracker.finish("KILLED")
    again = trackers.MlflowTracker({})
    again.start(
        trackers.RunStart(str(tmp_path), "unit", {**config, "max_epoch": 3}, 7, {"mlflow": tracker.run_id})
    )
    again.finish("FINISHED")
    run = MlflowClient(uri).get_run(tracker.run_id)
    params = run.data.params
    assert len(params["long"]) == 6000 and params["nested.a"] == "1" and params["nested.b.c"] == "(2, 3)"
    assert params["max_epoch"] == "2" and run.data.tags["changed.max_epoch"] == "3"  # params are immutable
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_mlflow_wandb_and_tensorboard_at_once_then_extended_with_the_same_runs(tiny_shapes_coco, tmp_path):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = offline_env(tmp_path)
    words = ["wandb-project", "tiny", "wandb-log_checkpoints", "true", "wandb-num_eval_imges", "2"]
    words += ["mlflow-experiment_name", "tiny"]

    def opts(max_epoch):
        return tiny_opts(
            tiny_shapes_coco["config"], tmp_path, max_epoch=max_epoch, no_aug_epochs=0, save_eval_report=True
        )

    first = train(tmp_path, opts(2) + words, "-l", "tensorboard,mlflow,wandb", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "run"
    log = run_dir / "train_log.txt"
    last_lr_before = logged_iterations(log)[-1][3]
    extended = train(tmp_path, opts(3) + words, "--resume", "-l", "tensorboard,mlflow,wandb", env=env)
    assert extended.returncode == 0, extended.stderr[-3000:]

    # the extension: the 3-epoch schedule from the resume point, the lr back up to that curve's value
    text = log.read_text()
    assert "max_epoch 2 -> 3: from epoch 3 on the schedule is the 3-epoch run's" in text
    steps = logged_iterations(log)
    assert [(e, i) for e, i, _, _ in steps] == [
        (e, i) for e in (1, 2, 3) for i in range(1, STEPS_PER_EPOCH + 1)
    ]
    fields = load_checkpoint(run_dir / "latest_ckpt.pth")["exp"]
    longer = LRScheduler(
        "yoloxwarmcos", 0.002 * 4, STEPS_PER_EPOCH, 3, warmup_epochs=1, min_lr_ratio=fields["min_lr_ratio"]
    )
    for e, i, _, lr in steps[2 * STEPS_PER_EPOCH :]:
        assert lr == pytest.approx(longer.update_lr((e - 1) * STEPS_PER_EPOCH + i - 1), rel=2e-3)
    assert steps[2 * STEPS_PER_EPOCH][3] > 3 * last_lr_before  # the cosine restarts: 0.0044 after 0.0012 here
    assert "\r" not in text and "eval [" in text

    # the checkpoint names the runs a resume continues
    runs = load_checkpoint(run_dir / "latest_ckpt.pth")["tracker_runs"]
    assert set(runs) == {"mlflow", "wandb"}

    # MLflow: one run, every step once, params from the exp, checkpoints and pictures as artifacts
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("tiny")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == runs["mlflow"] and run.info.status == "FINISHED" and run.info.run_name == "run"
    total = STEPS_PER_EPOCH * 3
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/total_loss")] == list(
        range(1, total + 1)
    )
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/AP50_95")] == [1, 2, 3]
    params = run.data.params
    assert (
        params["input_size"] == "(64, 64)"
        and params["basic_lr_per_img"] == "0.002"
        and params["batch_size"] == "4"
    )
    assert params["max_epoch"] == "2" and run.data.tags["changed.max_epoch"] == "3"

    def files(path=None):
        for item in client.list_artifacts(run.info.run_id, path):
            yield from files(item.path) if item.is_dir else [item.path]

    stored = set(files())
    assert {
        "checkpoints/latest_ckpt.pth",
        "checkpoints/best_ckpt.pth",
        "train_log.txt",
        "results.csv",
    } <= stored
    assert any(p.startswith("images/val~PR_curve") for p in stored)
    assert any(p.startswith("images/train_batch~mosaic") for p in stored)

    # W&B: two offline folders of one run id; the resumed one logs only the steps after the checkpoint
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(f.name.endswith(runs["wandb"]) for f in folders)
    logged = [
        [row["train/step"] for row in wandb_history(next(f.glob("*.wandb"))) if "train/lr" in row]
        for f in folders
    ]
    assert logged == [list(range(1, 13)), list(range(13, 19))]
    records = list(wandb_records(next(folders[0].glob("*.wandb"))))
    config = next(r.run.config for r in records if r.WhichOneof("record_type") == "run")
    assert {u.key: u.value_json for u in config.update}["max_epoch"] == "2"
    history = wandb_history(next(folders[1].glob("*.wandb")))
    detections = [row for row in history if "val/detections/_type" in row]
    assert detections and detections[0]["val/detections/count"] == 2 and detections[0]["epoch"] == 3
    assert detections[0]["val/detections/all_boxes"][0]["predictions"]["_type"] == "boxes2D"
    artifacts = [
        r.artifact
        for f in folders
        for r in wandb_records(next(f.glob("*.wandb")))
        if r.WhichOneof("record_type") == "artifact"
    ]
    assert [a.name for a in artifacts] == [f"run_{runs['wandb']}_model"] * 3
    aliases = [set(a.aliases) for a in artifacts]  # W&B keeps a set: their order is its own
    assert aliases[0] == {"best", "epoch-1", "latest"}  # the first evaluation is the best so far
    assert [sorted(a - {"best", "latest"}) for a in aliases] == [["epoch-1"], ["epoch-2"], ["epoch-3"]]
    assert all("latest" in a for a in aliases)

    # TensorBoard: what it logged before the trackers existed, each step once across the resume
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train/lr", "train/total_loss", "train/iou_loss", "val/AP50_95", "val/AP50"} <= set(
        tags["scalars"]
    )
    assert {"train_batch/mosaic", "train_batch/no_aug", "val/PR_curve", "val/confusion_matrix"} <= set(
        tags["images"]
    )
    assert [e.step for e in events.Scalars("train/total_loss")] == list(range(1, total + 1))

    # results.csv: one row per epoch, the resumed epoch appended
    rows = read_results(str(run_dir / "results.csv"))
    assert [r["epoch"] for r in rows] == [1, 2, 3] and all(r["AP50"] is not None for r in rows)
    assert (run_dir / "results.csv").read_text().splitlines()[0] == ",".join(COLUMNS)

    # resuming the finished run at its own length is refused: nothing is left to train
    args = load_tool("train").parse_args(
        ["-f", EXP_FILE, "-expn", "run", "-b", "4", "--resume", "-l", "none", *opts(3)]
    )
    exp = get_exp(args.exp_file)
    exp.merge(args.opts)
    with pytest.raises(ValueError, match="has trained 3 epochs and max_epoch is 3: nothing is left to train"):
        Trainer(exp, args).before_train()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_mlflow_against_a_real_tracking_server(tiny_shapes_coco, tmp_path):
    from mlflow.tracking import MlflowClient

    port = _free_port()
    server_log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
            "--default-artifact-root", str(tmp_path / "artifacts"),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        ],
        cwd=tmp_path, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.time() < deadline, (tmp_path / "server.log").read_text()[
                -2000:
            ]
            time.sleep(0.5)
        env = {
            "MLFLOW_TRACKING_URI": uri,
            "YOLOX_MLFLOW_RUN_NAME": "served",
            "MLFLOW_EXPERIMENT_NAME": "remote",
        }
        opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, max_epoch=1, no_aug_epochs=0)
        out = train(tmp_path, opts, "-l", "mlflow", env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("remote").experiment_id])
        assert run.info.run_name == "served" and run.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/lr")] == list(range(1, 7))
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val/AP50")] == [1]
        assert run.data.params["max_epoch"] == "1"
        assert "checkpoints/latest_ckpt.pth" in [
            a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")
        ]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        server_log.close()
