"""Samplers and loaders: disjoint seeded shards, resumable streams, close_mosaic with persistent workers."""

import itertools
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_tool_process
from torch.utils.data import default_collate

from yolox_fast.data.loader import PadCollate
from yolox_fast.data.sampler import InfiniteSampler, ShardSampler, YoloBatchSampler
from yolox_fast.exp import Exp
from yolox_fast.utils import dist as dist_utils


def _take(it, n):
    return list(itertools.islice(it, n))


def test_infinite_sampler_ranks_are_disjoint_and_reshuffled_each_pass():
    size, world = 23, 3
    per = size // world
    streams = [
        _take(iter(InfiniteSampler(size, seed=5, rank=r, world_size=world)), 3 * per) for r in range(world)
    ]
    for p in range(3):
        shards = [set(s[p * per : (p + 1) * per]) for s in streams]
        assert all(len(s) == per for s in shards)
        assert not (shards[0] & shards[1]) and not (shards[1] & shards[2]) and not (shards[0] & shards[2])
    assert streams[0][:per] != streams[0][per : 2 * per]  # a new order every pass
    assert streams[0] == _take(iter(InfiniteSampler(size, seed=5, rank=0, world_size=world)), 3 * per)
    assert streams[0] != _take(iter(InfiniteSampler(size, seed=6, rank=0, world_size=world)), 3 * per)
    assert len(InfiniteSampler(size, rank=0, world_size=world)) == per


def test_infinite_sampler_resumes_anywhere():
    sampler = InfiniteSampler(10, seed=1, rank=1, world_size=2)
    full = _take(sampler.indices_from(0), 40)
    assert _take(sampler.indices_from(13), 27) == full[13:]


def test_batch_sampler_carries_flag_and_seed_words():
    bs = YoloBatchSampler(InfiniteSampler(10, seed=2, rank=0, world_size=1), batch_size=4)
    first = next(iter(bs))
    assert [item[0] for item in first] == [True] * 4 and [item[2] for item in first] == [
        (2, 0, k) for k in range(4)
    ]
    bs.mosaic = False
    bs.start_batch = 3
    resumed = next(iter(bs))
    assert [item[0] for item in resumed] == [False] * 4 and resumed[0][2] == (2, 0, 12)
    assert len(bs) == 2


def test_shard_sampler_covers_each_index_once():
    shards = [list(ShardSampler(11, rank=r, world_size=4)) for r in range(4)]
    assert sorted(itertools.chain(*shards)) == list(range(11))
    assert [len(ShardSampler(11, rank=r, world_size=4)) for r in range(4)] == [3, 3, 3, 2]


def test_pad_collate_pads_and_truncates():
    batch = [
        (np.zeros((3, 8, 8), np.float32), np.ones((n, 5), np.float32), (8, 8), i)
        for i, n in enumerate((0, 2, 7))
    ]
    imgs, targets, _info, ids = PadCollate(max_labels=5)(batch)
    assert imgs.shape == (3, 3, 8, 8) and targets.shape == (3, 5, 5)
    assert (targets.sum(-1) > 0).sum(1).tolist() == [0, 2, 5] and ids == [0, 1, 2]


def test_pad_collate_of_train_samples_is_channels_last_and_equal_to_a_chw_stack():
    """TrainTransform hands out (3, H, W) views of HWC memory, mirrored or letterboxed; the batch is
    the same pixels as stacking CHW copies, already in the channels-last layout the model trains in."""
    from yolox_fast.data.augment import TrainTransform

    rng = np.random.default_rng(0)
    labels = np.array([[4.0, 6.0, 30.0, 20.0, 1.0]], np.float32)
    samples = []
    for i, shape in enumerate([(64, 64), (40, 64), (64, 64), (64, 48)]):  # as is, letterboxed, ...
        img = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        out, targets = TrainTransform(flip_prob=float(i % 2 == 0), hsv_prob=0.5)(
            img, labels, (64, 64), np.random.default_rng(i)
        )
        samples.append((out, targets, shape, i))
    imgs, targets, _info, _ids = PadCollate(max_labels=4)(samples)
    expected = torch.from_numpy(np.stack([np.ascontiguousarray(s[0]) for s in samples]))
    assert imgs.shape == (4, 3, 64, 64) and imgs.dtype == torch.uint8
    assert imgs.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(imgs, expected)
    chw = [(np.ascontiguousarray(s[0]), *s[1:]) for s in samples]  # a plain CHW sample stacks as well
    assert torch.equal(PadCollate(max_labels=4)(chw)[0], expected)
    # and a plain DataLoader's collate takes the samples too (no negative strides)
    assert torch.equal(default_collate([s[0] for s in samples]), expected)


def _exp(info, workers):
    exp = Exp()
    exp.dataset, exp.num_classes = info["config"], 6
    exp.input_size = exp.test_size = (96, 96)  # the images are 128 px: non-mosaic img_info says (128, 128)
    exp.data_num_workers = workers
    exp.seed = 3
    return exp


def test_train_loader_batches_and_close_mosaic_with_persistent_workers(tiny_shapes_coco):
    loader = _exp(tiny_shapes_coco, workers=2).get_data_loader(batch_size=4, is_distributed=False)
    assert len(loader) == 24 // 4 and loader.dataset.class_names[0] == "circle"
    assert loader.loader.persistent_workers
    it = iter(loader)
    imgs, targets, info, _ids = next(it)
    assert imgs.shape == (4, 3, 96, 96) and imgs.dtype == torch.uint8 and targets.shape == (4, 120, 5)
    assert info == [(96, 96)] * 4  # mosaic samples
    next(it)
    workers_before = [w.pid for w in loader.loader._iterator._workers]
    loader.close_mosaic()
    for _ in range(3):  # from the very next batch on: nothing prefetched with mosaic on comes through
        _, _, info, _ = next(it)
        assert info == [(128, 128)] * 4
    assert [w.pid for w in loader.loader._iterator._workers] == workers_before  # same persistent workers


def niceness(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


@pytest.mark.parametrize("setting", [None, 0, 7])
def test_training_workers_run_at_data_worker_nice_and_evaluation_workers_at_the_process_priority(
    tiny_shapes_coco, setting
):
    exp = _exp(tiny_shapes_coco, workers=2)
    exp.data_worker_nice = setting
    added = (0 if torch.cuda.is_available() else 19) if setting is None else setting  # None: by device
    own = niceness(0)
    loader = exp.get_data_loader(batch_size=4, is_distributed=False)
    it = iter(loader)
    next(it)
    assert [niceness(w.pid) for w in loader.loader._iterator._workers] == [min(own + added, 19)] * 2
    loader.close_mosaic()  # the restarted pipeline keeps its (persistent) workers, at their niceness
    next(it)
    assert [niceness(w.pid) for w in loader.loader._iterator._workers] == [min(own + added, 19)] * 2
    eval_batches = iter(exp.get_eval_loader(batch_size=4, is_distributed=False))
    next(eval_batches)
    assert [niceness(w.pid) for w in eval_batches._workers] == [own] * 2
    assert niceness(0) == own  # the training process itself keeps its priority


@pytest.mark.slow
def test_train_command_on_a_cpu_says_its_workers_run_at_the_lowest_priority(tiny_shapes_coco, tmp_path):
    out = run_tool_process(
        "train", "-f", "exps/example/shapes_nano.py", "-b", "4", "-l", "none", "dataset",
        tiny_shapes_coco["config"], "output_dir", str(tmp_path), "input_size", "(64,64)", "test_size",
        "(64,64)", "random_size", "(2,2)", "max_epoch", "1", "no_aug_epochs", "0", "data_num_workers", "1",
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    said = (
        r"\n *loader +1 workers at nice \+0\n"
        if torch.cuda.is_available()
        else (r"\n *loader +1 workers at nice \+19 \(below the training threads that share their CPU")
    )
    assert re.search(said, out), out[-3000:]
    assert "training done" in out and (tmp_path / "shapes_nano" / "best_ckpt.pth").is_file()


@pytest.mark.timeout(120)
def test_workers_start_after_a_threaded_cache_build(tiny_shapes_coco, tmp_path):
    # the cache is built by threads running OpenCV in this process, then the workers fork: a forked
    # worker that touches OpenCV's inherited thread pool blocks forever
    exp = _exp(tiny_shapes_coco, workers=2)
    exp.input_size = (320, 320)
    exp.cache_dir = str(tmp_path)
    loader = exp.get_data_loader(batch_size=2, is_distributed=False, cache_img="disk")
    assert loader.dataset.dataset.cache is not None
    assert next(iter(loader))[0].shape == (2, 3, 320, 320)


def test_batches_do_not_depend_on_worker_count(tiny_shapes_coco):
    batches = []
    for workers in (0, 2):
        it = iter(_exp(tiny_shapes_coco, workers).get_data_loader(batch_size=3, is_distributed=False))
        batches.append([next(it) for _ in range(2)])
    for a, b in zip(*batches):
        torch.testing.assert_close(a[0], b[0])
        torch.testing.assert_close(a[1], b[1])


def test_skip_to_resumes_the_stream_without_replay(tiny_shapes_coco):
    exp = _exp(tiny_shapes_coco, workers=0)
    it = iter(exp.get_data_loader(batch_size=2, is_distributed=False))
    fourth = [next(it) for _ in range(4)][3]
    resumed = exp.get_data_loader(batch_size=2, is_distributed=False)
    resumed.skip_to(3)
    batch = next(iter(resumed))
    torch.testing.assert_close(batch[0], fourth[0])
    assert batch[3] == fourth[3]


def test_eval_loader_shards_without_duplicates(tiny_shapes_coco, monkeypatch):
    exp = _exp(tiny_shapes_coco, workers=0)
    monkeypatch.setattr(dist_utils, "get_world_size", lambda: 3)
    seen = []
    for rank in range(3):
        monkeypatch.setattr(dist_utils, "get_rank", lambda r=rank: r)
        for imgs, targets, info, ids in exp.get_eval_loader(batch_size=2, is_distributed=True):
            assert imgs.shape[1:] == (3, 96, 96) and len(targets) == len(ids) == len(info[0])
            seen += ids.tolist()
    assert sorted(seen) == list(range(1, 9))


def test_eval_loader_workers_persist_from_one_pass_to_the_next(tiny_shapes_coco):
    # the trainer evaluates every epoch with one loader: its workers fork once, not from the grown process
    loader = _exp(tiny_shapes_coco, workers=2).get_eval_loader(batch_size=3, is_distributed=False)
    first = [(imgs, ids.tolist()) for imgs, _, _, ids in loader]
    workers = loader._iterator._workers
    second = [(imgs, ids.tolist()) for imgs, _, _, ids in loader]
    assert loader._iterator._workers == workers and all(w.is_alive() for w in workers)
    assert [ids for _, ids in first] == [ids for _, ids in second] == [[1, 2, 3], [4, 5, 6], [7, 8]]
    for (a, _), (b, _) in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("no_aug", [True, False])
def test_no_aug_loader_starts_without_mosaic(tiny_shapes_coco, no_aug):
    loader = _exp(tiny_shapes_coco, workers=0).get_data_loader(
        batch_size=2, is_distributed=False, no_aug=no_aug
    )
    _, _, info, _ = next(iter(loader))
    assert info == ([(128, 128)] * 2 if no_aug else [(96, 96)] * 2)
