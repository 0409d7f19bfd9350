"""One run per output folder: a second run is refused before it writes anything, naming the first; a
stale lock is taken over with a warning; the lock goes away after a normal run, an error and SIGTERM;
under DDP only rank 0 holds it and a refusal stops every rank."""

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import run_tool_here
from test_trainer import REPO, tiny_opts, train_args, train_cmd

from yolox_fast.core import trainer as trainer_mod
from yolox_fast.core.stop_signal import TrainingStopped
from yolox_fast.utils.run_lock import LOCK_NAME, RunLock, RunLockError

HOLDER = """
import sys, time
from yolox_fast.utils.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


@contextmanager
def hold_lock(folder: Path):
    """A process that holds `folder`'s lock while the block runs (killed on the way out)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def wait_for_line(proc, text: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if text in line:
            return
        if proc.poll() is not None:
            raise AssertionError(f"holder exited: {proc.stderr.read()[-2000:]}")
    raise AssertionError(f"no {text!r} within {timeout} s")


def write_lock(folder: Path, **owner) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    path.write_text(json.dumps(owner))
    return path


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_lock_names_its_holder_and_refuses_a_second_claim(tmp_path):
    folder = tmp_path / "run"
    with hold_lock(folder) as holder:
        wait_for_line(holder, "held")
        owner = json.loads((folder / LOCK_NAME).read_text())
        assert owner["pid"] == holder.pid and owner["host"] == socket.gethostname()
        assert str(folder) in owner["command"] and owner["started"][:4].isdigit()
        with pytest.raises(RunLockError) as err:
            RunLock(folder).acquire(force=True)  # --force-lock never overrides a live holder
        message = str(err.value)
        for part in (f"PID {holder.pid}", socket.gethostname(), owner["started"], "in use", str(folder)):
            assert part in message


def test_a_dead_holder_on_this_host_is_taken_over_with_a_warning(tmp_path, log_lines):
    folder = tmp_path / "run"
    with hold_lock(folder) as holder:
        wait_for_line(holder, "held")
        os.kill(holder.pid, signal.SIGKILL)  # no clean-up: the file stays, the kernel drops the lock
        holder.wait(30)
    assert (folder / LOCK_NAME).is_file()
    lock = RunLock(folder)
    lock.acquire()
    lock.release()
    assert any(f"stale lock {folder / LOCK_NAME}" in x and f"PID {holder.pid}" in x for x in log_lines)
    assert any("no longer runs" in x for x in log_lines)
    assert not (folder / LOCK_NAME).exists()


def test_a_reused_pid_on_this_host_does_not_keep_a_free_lock(tmp_path, log_lines):
    write_lock(tmp_path, pid=os.getppid(), host=socket.gethostname(), started="then", command="old")
    lock = RunLock(tmp_path)
    lock.acquire()
    lock.release()
    assert any("belongs to another process" in x for x in log_lines)


def test_a_lock_left_on_another_host_is_refused_unless_forced(tmp_path, log_lines):
    path = write_lock(tmp_path, pid=4242, host="elsewhere", started="2026-01-01T00:00:00", command="train")
    with pytest.raises(RunLockError) as err:
        RunLock(tmp_path).acquire()
    for part in ("another host", "PID 4242 on host elsewhere", "2026-01-01", "--force-lock", str(path)):
        assert part in str(err.value)
    assert json.loads(path.read_text())["host"] == "elsewhere"  # a refusal leaves the file as it was
    lock = RunLock(tmp_path)
    lock.acquire(force=True)
    lock.release()
    assert any("--force-lock: taking over" in x and "elsewhere" in x for x in log_lines)


def test_an_earlier_attempt_of_the_same_job_on_another_host_is_taken_over(tmp_path):
    write_lock(tmp_path, pid=4242, host="node07", started="then", command="train", job="slurm:77")
    with pytest.raises(RunLockError):
        RunLock(tmp_path).acquire(environ={"SLURM_JOB_ID": "78"})
    lock = RunLock(tmp_path)
    lock.acquire(environ={"SLURM_JOB_ID": "77"})  # a requeued job whose rank 0 moved to this host
    lock.release()


def test_released_lock_is_gone_and_a_second_claim_in_one_process_is_refused(tmp_path):
    lock = RunLock(tmp_path)
    lock.acquire()
    with pytest.raises(RunLockError, match="already trains into"):
        RunLock(tmp_path).acquire()
    lock.release()
    lock.release()  # idempotent
    assert not (tmp_path / LOCK_NAME).exists()
    again = RunLock(tmp_path)
    again.acquire()
    again.release()


def test_lock_is_released_when_training_raises(tiny_shapes_coco, tmp_path, monkeypatch):
    class Exploding:
        def __init__(self, exp, args):
            assert (Path(exp.output_dir) / "run" / LOCK_NAME).is_file()  # held while training

        def train(self):
            raise RuntimeError("boom")

    monkeypatch.setattr(trainer_mod, "Trainer", Exploding)
    with pytest.raises(RuntimeError, match="boom"):
        trainer_mod.run_training(train_args(tiny_shapes_coco["config"], tmp_path))
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_a_stopped_run_exits_with_its_code_and_lets_the_trainer_go(tiny_shapes_coco, tmp_path, monkeypatch):
    """The exit after a stop carries no traceback that would keep the trainer (and its DDP model and
    process group) alive until the interpreter finalizes."""
    trainers = []

    class Stopped:
        def __init__(self, exp, args):
            trainers.append(weakref.ref(self))

        def train(self):
            raise TrainingStopped(signal.SIGTERM, None)

    monkeypatch.setattr(trainer_mod, "Trainer", Stopped)
    with pytest.raises(SystemExit) as exited:
        trainer_mod.run_training(train_args(tiny_shapes_coco["config"], tmp_path))
    assert exited.value.code == 128 + signal.SIGTERM
    assert exited.value.__context__ is None
    gc.collect()
    assert trainers[0]() is None
    assert not (tmp_path / "run" / LOCK_NAME).exists()


@pytest.mark.slow
def test_second_training_into_a_folder_in_use_is_refused_before_writing_anything(tiny_shapes_coco, tmp_path):
    opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, max_epoch=1, no_aug_epochs=0)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with hold_lock(tmp_path / "run") as holder:
        wait_for_line(holder, "held")
        # under DDP (-d 2): rank 0 refuses, and rank 1 must neither train alone nor wait for rank 0
        refused = subprocess.run(
            train_cmd(opts, "-d", "2"), cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert (
        f"in use by another training run: PID {holder.pid} on host {socket.gethostname()}" in refused.stderr
    )
    assert "rank 0 could not lock the output folder" in refused.stderr  # what rank 1 says
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [LOCK_NAME]  # nothing written


@pytest.mark.slow
def test_stale_lock_is_taken_over_and_a_normal_run_removes_it(tiny_shapes_coco, tmp_path):
    pid = dead_pid()
    write_lock(tmp_path / "run", pid=pid, host=socket.gethostname(), started="earlier", command="crashed run")
    opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, max_epoch=1, no_aug_epochs=0)
    done = run_tool_here("train", *train_cmd(opts)[2:])  # as typed, in this process
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"taking over the stale lock {tmp_path / 'run' / LOCK_NAME} left by PID {pid}" in done.stderr
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert (tmp_path / "run" / "latest_ckpt.pth").is_file()
