"""Distributed training on CPU (gloo): ranks stay in sync, the loss is normalised by the global
number of foreground anchors, and torchrun restarts a killed rank into the right epoch."""

import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from test_trainer import running

from yolox_fast.core.launch import launch, under_torchrun
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


def test_under_torchrun_reads_the_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert not under_torchrun()
    env = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert under_torchrun()


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
    assert "torchrun restart 1: continuing from" in text
    for epoch in (1, 2, 3):  # every epoch finished exactly once: none lost, none repeated
        assert len(re.findall(rf"epoch {epoch}/3 finished", text)) == 1, epoch
    final = load_checkpoint(tmp_path / "run" / "latest_ckpt.pth")
    per_epoch = int(re.search(r"iter: \d+/(\d+)", text)[1])
    assert final["start_epoch"] == 3 and final["iter"] == 0
    assert final["ema"]["updates"] == 3 * per_epoch  # the optimiser stepped once per iteration of 3 epochs
