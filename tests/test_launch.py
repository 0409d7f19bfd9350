"""Distributed training on CPU (gloo): ranks stay in sync, the loss is normalised by the global
number of foreground anchors; every launcher (torchrun on one or two agents, RANK/WORLD_SIZE as
Kubeflow sets it, srun, YOLOX's --num_machines) trains, and continues after a restart; ranks that
disagree on the world size stop with a message instead of hanging."""

import atexit
import gc
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from helpers import load_tool
from test_trainer import running, tiny_opts, train_cmd

from yolox_fast.core.cluster_env import SLURM_PORT_BASE, SLURM_PORT_SPAN, LaunchEnvError
from yolox_fast.core.launch import LAUNCHER_LABELS, _free_port, agree_on_world, cuda_index, launch
from yolox_fast.exp import get_exp
from yolox_fast.utils.checkpoint import load_checkpoint
from yolox_fast.utils.dist import all_gather_object

REPO = Path(__file__).resolve().parents[1]
BOXES_PER_IMAGE = {0: 1, 1: 5}  # the ranks see different amounts of ground truth


def nano(num_classes: int = 3):
    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = num_classes
    torch.manual_seed(0)
    return exp.get_model().train()


def rank_batch(rank: int, size: int = 64):
    """(imgs (2, 3, size, size), targets (2, 8, 5)) for `rank`, BOXES_PER_IMAGE[rank] boxes per image."""
    gen = torch.Generator().manual_seed(100 + rank)
    imgs = torch.rand(2, 3, size, size, generator=gen) * 255
    targets = torch.zeros(2, 8, 5)
    n = BOXES_PER_IMAGE[rank]
    targets[:, :n, 0] = torch.randint(0, 3, (2, n), generator=gen).float()
    targets[:, :n, 1:3] = 16 + torch.rand(2, n, 2, generator=gen) * 32
    targets[:, :n, 3:5] = 8 + torch.rand(2, n, 2, generator=gen) * 16
    return imgs, targets


def ddp_step_worker(out_dir: str) -> None:
    """One DDP training step; saves this rank's losses and whether all ranks hold the same weights."""
    rank = dist.get_rank()
    model = nano()
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    outputs = ddp(*rank_batch(rank))
    outputs["total_loss"].backward()
    optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = all_gather_object(weights)
    torch.save(
        {
            "losses": {k: float(v) for k, v in outputs.items()},
            "in_sync": all(torch.equal(weights, w) for w in everyone),
            "changed": not torch.equal(
                weights, torch.cat([p.detach().flatten() for p in nano().parameters()])
            ),
            "world": dist.get_world_size(),
            "env_rank": os.environ["RANK"],
        },
        Path(out_dir) / f"rank{rank}.pt",
    )


def test_train_and_eval_take_the_same_launch_flags():
    """One definition of YOLOX's process flags serves both tools; only -d's default differs (train: every
    GPU, eval: one process)."""
    argv = ["-d", "2", "--dist-backend", "gloo", "--dist-url", "tcp://host:1234"]
    argv += ["--num_machines", "2", "--machine_rank", "1"]
    keys = ("devices", "dist_backend", "dist_url", "num_machines", "machine_rank")
    parsers = [load_tool(name).make_parser() for name in ("train", "eval")]
    for parser in parsers:
        args = parser.parse_args(argv)
        assert [getattr(args, k) for k in keys] == [2, "gloo", "tcp://host:1234", 2, 1]
    defaults = [parser.parse_args([]) for parser in parsers]
    assert [[getattr(d, k) for k in keys] for d in defaults] == [
        [None, None, None, 1, 0],
        [1, None, None, 1, 0],
    ]


@pytest.mark.slow
def test_two_cpu_processes_stay_in_sync_and_share_the_fg_normaliser(tmp_path):
    launch(ddp_step_worker, 2, backend="gloo", dist_url="auto", args=(str(tmp_path),))
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(r["world"] == 2 and r["in_sync"] and r["changed"] for r in results)
    assert [r["env_rank"] for r in results] == ["0", "1"]

    # the same model on each rank's batch alone (single process): local foreground counts and losses
    with torch.no_grad():
        single = [nano()(*rank_batch(r)) for r in range(2)]
    # the loss reports foreground anchors per ground truth; each image of rank r has BOXES_PER_IMAGE[r]
    local_fg = [round(float(s["num_fg"]) * 2 * BOXES_PER_IMAGE[r]) for r, s in enumerate(single)]
    assert local_fg[0] != local_fg[1]
    per_rank_fg = sum(local_fg) / 2
    for rank, (ddp, alone) in enumerate(zip(results, single)):
        # every rank divides by the global count per rank, so DDP's gradient average equals the
        # gradient of (sum of all ranks' losses) / (all ranks' foreground count)
        for key in ("iou_loss", "conf_loss", "cls_loss"):
            expected = float(alone[key]) * max(local_fg[rank], 1) / max(per_rank_fg, 1)
            assert ddp["losses"][key] == pytest.approx(expected, rel=1e-3), (rank, key)


def _count_ddp_models(path: Path) -> None:
    alive = sum(isinstance(o, torch.nn.parallel.DistributedDataParallel) for o in gc.get_objects())
    path.write_text(str(alive))


def cyclic_ddp_worker(out_dir: str) -> None:
    """A DDP model left in a reference cycle (as a trainer's can be, through bound methods), then an exit
    code; at exit the process records how many DDP models are still alive."""
    gc.disable()  # only an explicit collection frees the cycle before the interpreter finalizes
    atexit.register(_count_ddp_models, Path(out_dir) / f"rank{dist.get_rank()}.txt")
    holder = {"model": torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))}
    holder["self"] = holder
    holder["model"](torch.randn(2, 4)).sum().backward()
    del holder
    raise SystemExit(3)


@pytest.mark.slow
def test_spawned_ranks_free_their_ddp_model_before_the_interpreter_finalizes(tmp_path):
    """A process group freed in the interpreter's final collection aborts the rank (SIGABRT) instead of
    letting it exit with its code (seen on a SIGTERM stop): the launcher collects it while all is alive."""
    with pytest.raises(SystemExit) as exited:
        launch(cyclic_ddp_worker, 2, backend="gloo", dist_url="auto", args=(str(tmp_path),))
    assert exited.value.code == 3
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == ["0", "0"]


def test_single_process_launch_calls_directly():
    seen = []
    launch(seen.append, 1, args=("ran",))
    assert seen == ["ran"]


@pytest.mark.slow
def test_torchrun_restarts_a_killed_rank_from_the_newest_checkpoint(tiny_shapes_coco, tmp_path):
    opts = {
        "dataset": tiny_shapes_coco["config"],
        "output_dir": str(tmp_path),
        "input_size": "(64,64)",
        "test_size": "(64,64)",
        "random_size": "(2,2)",
        "data_num_workers": 0,
        "max_epoch": 3,
        "no_aug_epochs": 1,
        "warmup_epochs": 1,
        "eval_interval": 1,
        "print_interval": 1,
        "seed": 0,
        "mosaic_prob": 0.5,
        "save_eval_report": False,
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "1",
        str(REPO / "tools" / "train.py"),
        "-f",
        str(REPO / "exps" / "example" / "shapes_nano.py"),
        "-expn",
        "run",
        "-b",
        "4",
        "--logger",
        "none",
        *[str(x) for kv in opts.items() for x in kv],
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "run" / "train_log.txt"
    killed = False
    with running(cmd, env=env) as proc:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None and not killed:
            if log.is_file() and "epoch: 2/3, iter: 2/" in log.read_text():
                workers = [
                    c for c in psutil.Process(proc.pid).children() if c.environ().get("LOCAL_RANK") == "1"
                ]
                assert len(workers) == 1
                os.kill(workers[0].pid, signal.SIGKILL)
                killed = True
            time.sleep(0.02)
        _, err = proc.communicate(timeout=300)
    assert killed and proc.returncode == 0, err[-3000:]
    text = log.read_text()
    assert "restart 1 (torchrun restart or SLURM requeue): continuing from" in text
    for epoch in (1, 2, 3):  # every epoch finished exactly once: none lost, none repeated
        assert len(re.findall(rf"epoch {epoch}/3 finished", text)) == 1, epoch
    final = load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")
    per_epoch = int(re.search(r"iter: \d+/(\d+)", text)[1])
    assert final["start_epoch"] == 3 and final["iter"] == 0
    assert final["ema"]["updates"] == 3 * per_epoch  # the optimiser stepped once per iteration of 3 epochs


# ---------------------------------------------------------------------------- every launcher
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env(**extra) -> dict:
    """This test process's environment without any launcher's variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "YOLOX_FAST_"))
    }
    return {**env, "OMP_NUM_THREADS": "1", **{k: str(v) for k, v in extra.items()}}


def free_port_in(low: int, high: int) -> int:
    """A free TCP port in [low, high) (the SLURM default port range)."""
    for port in random.Random().sample(range(low, high), 200):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}..{high}")


def two_processes(launcher: str, opts: list) -> list[tuple[list, dict]]:
    """(command, environment) of the two processes of a 2-rank job as `launcher` starts them."""
    if launcher == "env":  # Kubeflow PyTorchJob: one process per pod, no LOCAL_RANK
        port = _free_port()
        return [
            (train_cmd(opts), clean_env(RANK=r, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
            for r in range(2)
        ]
    if launcher == "slurm":  # what srun sets for two tasks on one node; the port derives from the job id
        port = free_port_in(SLURM_PORT_BASE, SLURM_PORT_BASE + SLURM_PORT_SPAN)
        slurm = {"SLURM_JOB_ID": port - SLURM_PORT_BASE, "SLURM_STEP_ID": 0, "SLURM_NTASKS": 2}
        slurm["SLURM_NODELIST"] = "localhost"
        return [(train_cmd(opts), clean_env(**slurm, SLURM_PROCID=r, SLURM_LOCALID=r)) for r in range(2)]
    url = f"tcp://127.0.0.1:{_free_port()}"  # YOLOX: two "machines" started by hand
    return [
        (
            train_cmd(opts, "-d", "1", "--num_machines", "2", "--machine_rank", str(r), "--dist-url", url),
            clean_env(),
        )
        for r in range(2)
    ]


@contextmanager
def started(jobs: list[tuple[list, dict]], logs: Path):
    """Popen every (command, env) with stderr to logs/<i>.err; whatever is left is killed on the way out."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for i, (cmd, env) in enumerate(jobs):
            with open(logs / f"{i}.err", "w") as err:
                procs.append(
                    subprocess.Popen(
                        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
                    )
                )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_all(procs, logs: Path, timeout: float) -> list[int]:
    deadline = time.time() + timeout
    for proc in procs:
        proc.wait(max(1.0, deadline - time.time()))
    return [p.returncode for p in procs]


def stderr_of(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.err")))


def wait_for_log(log: Path, text: str, procs, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if log.is_file() and text in log.read_text():
            return
        assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {log} within {timeout} s")


LABELS = {"env": LAUNCHER_LABELS["env"], "slurm": LAUNCHER_LABELS["slurm"], "yolox": LAUNCHER_LABELS["yolox"]}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["env", "slurm", "yolox"])
def test_launcher_trains_two_ranks_and_a_rerun_with_auto_resume_continues(
    launcher, tiny_shapes_coco, tmp_path
):
    """Two processes as the launcher starts them form one group, whose rank 0 holds the output folder's
    lock; SIGTERM to both (a preempted job) saves the position and releases the lock, and the same
    commands with --auto-resume (a requeued job, a restarted pod) continue from it: no iteration lost
    or repeated."""
    from test_trainer import iters_per_epoch, logged_iterations

    opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, max_epoch=1, no_aug_epochs=0)
    jobs = two_processes(launcher, opts)
    log = tmp_path / "run" / "train_log.txt"
    with started(jobs, tmp_path / "first") as procs:
        wait_for_log(log, "iter: 3/", procs)
        owner = json.loads((tmp_path / "run" / ".lock").read_text())
        if launcher == "yolox":  # machine 0's process spawned rank 0
            children = psutil.Process(procs[0].pid).children()
            assert owner["pid"] in [c.pid for c in children if "spawn_main" in " ".join(c.cmdline())]
        else:
            assert owner["pid"] == procs[0].pid  # rank 0, never rank 1
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
        codes = wait_all(procs, tmp_path / "first", 240)
    assert codes == [128 + signal.SIGTERM] * 2, stderr_of(tmp_path / "first")
    assert not (tmp_path / "run" / ".lock").exists()
    text = log.read_text()
    assert "processes   2 (gloo)" in text and f"launcher    {LABELS[launcher]}" in text
    per_epoch = iters_per_epoch(log)
    stopped = load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")
    assert stopped["start_epoch"] == 0 and 3 <= stopped["iter"] < per_epoch

    rerun = [(cmd[:2] + ["--auto-resume"] + cmd[2:], env) for cmd, env in jobs]
    with started(rerun, tmp_path / "rerun") as procs:
        codes = wait_all(procs, tmp_path / "rerun", 300)
    assert codes == [0, 0], stderr_of(tmp_path / "rerun")
    assert "auto-resume (restart 0): continuing from" in log.read_text()
    positions = [(e, i) for e, i, _, _ in logged_iterations(log)]
    assert sorted(positions) == [(1, i) for i in range(1, per_epoch + 1)]  # none lost, none repeated
    final = load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")
    assert final["start_epoch"] == 1 and final["ema"]["updates"] == per_epoch
    assert not (tmp_path / "run" / ".lock").exists()


@pytest.mark.slow
def test_processes_that_disagree_on_the_world_size_or_miss_variables_stop_with_a_message(tmp_path):
    port = _free_port()
    opts = ["max_epoch", "1"]  # never reached
    jobs = [
        (train_cmd(opts), clean_env(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)),
        (train_cmd(opts), clean_env(RANK=1, WORLD_SIZE=3, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)),
        (train_cmd(opts), clean_env(RANK=1)),  # half-configured: RANK without WORLD_SIZE
    ]
    with started(jobs, tmp_path) as procs:
        codes = wait_all(procs, tmp_path, 180)
    assert all(code != 0 for code in codes), stderr_of(tmp_path)
    for i in (0, 1):
        assert "the processes disagree on the world size" in (tmp_path / f"{i}.err").read_text(), stderr_of(
            tmp_path
        )
    assert "RANK is set but WORLD_SIZE is not" in (tmp_path / "2.err").read_text()


def _agree(store_port: int, rank: int, world: int, results: dict) -> None:
    try:
        store = dist.TCPStore(
            "127.0.0.1",
            store_port,
            None,
            is_master=rank == 0,
            timeout=timedelta(seconds=30),
            wait_for_workers=False,
        )
        agree_on_world(store, rank, world, timedelta(seconds=30))
        results[rank] = "ok"
    except LaunchEnvError as err:
        results[rank] = str(err)


@pytest.mark.parametrize(
    "worlds, expected",
    [
        ({0: 2, 1: 2}, {0: "ok", 1: "ok"}),
        ({0: 3, 1: 2}, {0: "disagree on the world size", 1: "disagree on the world size"}),
        ({0: 2, 1: 3}, {0: "disagree on the world size", 1: "disagree on the world size"}),
    ],
)
def test_ranks_agree_on_the_world_size_before_the_group_forms(worlds, expected):
    port, results = _free_port(), {}
    threads = [threading.Thread(target=_agree, args=(port, r, w, results)) for r, w in worlds.items()]
    for t in threads:
        t.start()
        time.sleep(0.2)  # rank 0 hosts the store
    for t in threads:
        t.join(60)
    assert set(results) == set(worlds)
    for rank, text in expected.items():
        assert text in results[rank], results


def test_a_missing_rank_is_reported_after_the_timeout():
    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, None, is_master=True, wait_for_workers=False)
    with pytest.raises(LaunchEnvError, match=r"ranks \[1\] of 2 did not join"):
        agree_on_world(store, 0, 2, timedelta(seconds=1))


def test_cuda_index_follows_the_local_rank_or_the_one_bound_gpu():
    assert cuda_index(3, count=8) == 3
    assert cuda_index(3, count=1) == 0  # srun --gpus-per-task 1: each task sees its own GPU as cuda:0
    with pytest.raises(LaunchEnvError, match="local rank 5 but this process sees 4 GPUs"):
        cuda_index(5, count=4)


@pytest.mark.slow
def test_two_torchrun_agents_on_one_host_share_one_ram_cache_and_survive_a_restart(
    tiny_shapes_coco, tmp_path
):
    """torchrun --nnodes 2 with both agents here: both workers have LOCAL_RANK 0; the cache's file lock
    makes one build and the other map. Killing one worker restarts both agents' workers (one agent counts
    it as a restart, the other, whose worker was healthy, may not), and training continues from the
    newest checkpoint."""
    shm_before = set(Path("/dev/shm").glob("*yolox_fast-tiny_shapes_coco*"))
    opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, max_epoch=2, no_aug_epochs=0, eval_interval=10)
    rdzv = [
        "--nnodes", "2", "--nproc_per_node", "1", "--max-restarts", "1", "--monitor-interval", "0.5",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{_free_port()}", "--rdzv_id", "two_agents",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", *rdzv, *train_cmd(opts, "--cache", "ram")[1:]]
    log = tmp_path / "run" / "train_log.txt"
    try:
        with started([(cmd, clean_env()), (cmd, clean_env())], tmp_path / "agents") as agents:
            wait_for_log(log, "epoch: 2/2, iter: 3/", agents)
            workers = [
                c
                for agent in agents
                for c in psutil.Process(agent.pid).children()
                if c.environ().get("RANK") == "1"
            ]
            assert len(workers) == 1
            os.kill(workers[0].pid, signal.SIGKILL)
            codes = wait_all(agents, tmp_path / "agents", 300)
        assert codes == [0, 0], stderr_of(tmp_path / "agents")
        text = log.read_text()
        assert "launcher    torchrun" in text and "cache       ram" in text
        assert "restart 1 (torchrun restart or SLURM requeue): continuing from" in text
        for epoch in (1, 2):
            assert len(re.findall(rf"epoch {epoch}/2 finished", text)) == 1, epoch
        assert load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")["start_epoch"] == 2
        mapped = re.search(r"ram cache: mapped (/dev/shm/\S+\.bin)", text)
        assert mapped and Path(mapped[1]).is_file()  # (test_cache checks that one process built it)
        assert not list(Path("/dev/shm").glob(f"{Path(mapped[1]).name}.tmp-*"))
    finally:
        for path in set(Path("/dev/shm").glob("*yolox_fast-tiny_shapes_coco*")) - shm_before:
            path.unlink(missing_ok=True)
