"""Distributed evaluation: 2 CPU processes (gloo) on an odd-sized set score every image exactly once,
get the single-process AP and report (written by rank 0 alone), and all fail together (no rank left
waiting) when shards overlap."""

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from oracle_model import oracle_for, shapes_exp

from yolox_fast.data.datasets.synthetic import default_description, generate
from yolox_fast.evaluators.build import build_evaluator
from yolox_fast.evaluators.report import write_eval_report

NUM_VAL = 7  # odd: the two shards differ in size (4 + 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _FailsOnRank1(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if dist.get_rank() == 1:
            raise ValueError("broken on purpose")
        return self.inner(x)


def _expect_error(evaluator, model) -> str:
    try:
        evaluator.evaluate(model, distributed=True)
    except RuntimeError as err:
        return str(err)
    return ""


def _worker(rank: int, world: int, port: int, config: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        exp = shapes_exp(config)
        evaluator = build_evaluator(exp, batch_size=2, is_distributed=True)
        shard = len(evaluator.dataloader.sampler)
        model, _ = oracle_for(evaluator.dataloader.dataset, exp.num_classes, exp.test_size, noise=True)
        ap50_95, ap50, _ = evaluator.evaluate(model, distributed=True)
        scored = evaluator.last_result["num_images"]
        result = {"ap50_95": ap50_95, "ap50": ap50, "scored": scored, "shard": shard}
        result["reported"] = (
            write_eval_report(evaluator, exp, os.path.join(out_dir, f"report{rank}")) is not None
        )

        # every rank evaluating the whole set: rank 0 detects the duplicates; all ranks must raise
        overlapping = build_evaluator(exp, batch_size=2, is_distributed=False)
        result["overlap_error"] = _expect_error(overlapping, model)
        # inference failing on rank 1 only: rank 0 must not wait for it forever
        result["rank1_error"] = _expect_error(evaluator, _FailsOnRank1(model))
        dist.barrier()  # reached only if no rank is stuck
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_process_eval_equals_single_process(tmp_path):
    root = tmp_path / "shapes"
    generate(
        default_description("coco", str(root), name="odd_shapes"),
        {"num_train": 1, "num_val": NUM_VAL, "size": 96, "seed": 1, "max_objects": 5},
    )
    config = str(root / "dataset.json")

    exp = shapes_exp(config)
    single = build_evaluator(exp, batch_size=2, is_distributed=False)
    model, _ = oracle_for(single.dataloader.dataset, exp.num_classes, exp.test_size, noise=True)
    ap50_95, ap50, _ = single.evaluate(model)
    assert single.last_result["num_images"] == NUM_VAL
    write_eval_report(single, exp, str(tmp_path / "single"))

    mp.spawn(_worker, args=(2, _free_port(), config, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(r["shard"] for r in results) == [3, 4]
    for r in results:
        assert r["scored"] == NUM_VAL
        assert r["ap50_95"] == ap50_95  # exactly: the same detections scored once, not an average
        assert r["ap50"] == ap50
        assert "another rank also evaluated" in r["overlap_error"]
        assert "rank 1: ValueError: broken on purpose" in r["rank1_error"]
    assert [r["reported"] for r in results] == [True, False]  # rank 0 alone writes the report
    assert not (tmp_path / "report1").exists()
    for name in ("per_class.csv", "confusion_matrix.json", "detections.json"):
        assert (tmp_path / "report0" / name).read_text() == (tmp_path / "single" / name).read_text(), name
