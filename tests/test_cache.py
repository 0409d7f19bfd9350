"""ImageCache: same pixels as uncached, rebuilt when stale or truncated, one shared copy across processes."""

import json
import multiprocessing as mp
import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from yolox_fast.data import cache as cache_mod
from yolox_fast.data.cache import build_cache
from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.description import read_description
from yolox_fast.data.mosaic import MosaicDetection
from yolox_fast.exp import Exp


@pytest.fixture
def shm_dir(monkeypatch):
    """A private folder inside /dev/shm for this test's ram caches, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="yolox_fast_test_", dir="/dev/shm"))
    monkeypatch.setattr(cache_mod, "SHM_DIR", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _dataset(root, size=(96, 96), **kw):
    return COCODataset(str(root), "train2017", "instances_train2017.json", img_size=size, name="t", **kw)


@pytest.fixture
def tiny_root(tiny_shapes_coco):
    return read_description(tiny_shapes_coco["config"])["root"]


@pytest.mark.parametrize("mode", ["ram", "disk"])
def test_cached_items_equal_uncached(mode, tiny_root, shm_dir, tmp_path):
    plain, cached = _dataset(tiny_root, (96, 80)), _dataset(tiny_root, (96, 80))
    cache = build_cache(cached, mode, cache_dir=str(tmp_path))
    assert cache.path.parent == (shm_dir if mode == "ram" else tmp_path)
    cached.attach_cache(cache)
    for i in range(len(plain)):
        a, b = plain.pull_item(i), cached.pull_item(i)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    kwargs = {"img_size": (96, 80), "mixup_prob": 1.0, "mosaic_prob": 1.0}
    for item in [(True, 3, (0, 0, 1)), (True, 7, (0, 0, 2)), (False, 1, (0, 0, 3))]:  # whole training samples
        a, b = MosaicDetection(plain, **kwargs)[item], MosaicDetection(cached, **kwargs)[item]
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_truncated_or_unfinished_cache_is_rebuilt(tiny_root, shm_dir, log_lines):
    ds = _dataset(tiny_root)
    first = build_cache(ds, "ram")
    assert sum("building cache" in line for line in log_lines) == 1
    build_cache(ds, "ram")
    assert sum("building cache" in line for line in log_lines) == 1  # valid: mapped, not rebuilt

    with open(first.path, "r+b") as f:
        f.truncate(first.nbytes - 1000)
    rebuilt = build_cache(ds, "ram")
    assert sum("building cache" in line for line in log_lines) == 2
    assert rebuilt.path.stat().st_size == first.nbytes

    rebuilt.path.with_suffix(".json").unlink()  # a build killed before writing its completion marker ...
    leftover = rebuilt.path.with_name(rebuilt.path.name + ".tmp-99999")  # ... and one killed mid-write
    leftover.write_bytes(b"x" * 100)
    again = build_cache(ds, "ram")
    assert not leftover.exists()  # removed: in /dev/shm it would hold RAM until reboot
    assert sum("building cache" in line for line in log_lines) == 3
    ds.attach_cache(again)
    np.testing.assert_array_equal(ds.pull_item(0)[0], _dataset(tiny_root).pull_item(0)[0])


def test_key_changes_with_image_list_and_size(tiny_root, shm_dir, log_lines):
    ds = _dataset(tiny_root)
    a = build_cache(ds, "ram")
    b = build_cache(_dataset(tiny_root, (64, 64)), "ram")
    ds.index = ds.index.subset(np.arange(len(ds)) < len(ds) - 1)
    c = build_cache(ds, "ram")
    assert len({a.path, b.path, c.path}) == 3
    assert any("other caches of dataset t" in line and a.path.name in line for line in log_lines)
    meta = json.loads(c.path.with_suffix(".json").read_text())
    assert meta["shape"] == [len(ds), 96, 96, 3]


def test_not_enough_room_warns_with_numbers_or_fails_when_strict(tiny_root, shm_dir, monkeypatch, log_lines):
    monkeypatch.setattr(cache_mod, "free_bytes", lambda mode, folder: (1000, "0.0 GiB free in test"))
    assert build_cache(_dataset(tiny_root), "ram") is None
    assert any("needs" in line and "GiB" in line and "WITHOUT a cache" in line for line in log_lines)
    with pytest.raises(RuntimeError, match="needs .* GiB"):
        build_cache(_dataset(tiny_root), "ram", strict=True)


def test_exp_cache_argument_reaches_the_dataset(tiny_shapes_coco, shm_dir, monkeypatch, tmp_path):
    exp = Exp()
    exp.dataset, exp.num_classes, exp.input_size = tiny_shapes_coco["config"], 6, (64, 64)
    assert exp.get_dataset(cache=True).cache.path.parent == shm_dir
    assert exp.get_dataset().cache is None
    monkeypatch.setattr(cache_mod, "free_bytes", lambda mode, folder: (0, "none"))
    exp.cache_strict, exp.cache_dir = True, str(tmp_path)
    with pytest.raises(RuntimeError):
        exp.get_dataset(cache="disk")


def test_corrupt_image_in_cache_build(tiny_root, tmp_path, shm_dir):
    root = tmp_path / "copy"
    shutil.copytree(tiny_root, root)
    (root / "train2017" / "000003.jpg").write_bytes(b"garbage")
    ds = _dataset(root)
    ds.attach_cache(build_cache(ds, "ram"))
    assert not ds.cache.ok[2] and 2 in ds.damaged  # marked at the build: the trainer counts it
    assert ds.pull_item(2)[3] == 4  # skipped: the next image stands in


def _smaps_entry(pid: int, path: str) -> dict:
    """Summed kB fields of `path`'s mappings in /proc/<pid>/smaps."""
    fields: dict = {}
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = line.endswith(path)
        elif inside and len(head) >= 3 and head[2] == "kB":
            fields[head[0].rstrip(":")] = fields.get(head[0].rstrip(":"), 0) + int(head[1])
    return fields


def _reader(blob: bytes, ready, done) -> None:
    cache = pickle.loads(blob)  # as a spawned loader worker receives it: metadata only, then maps the file
    total = sum(int(cache.get(i)[0, 0, 0]) for i in range(cache.shape[0]))
    np.asarray(cache.array).sum()  # touch every page
    ready.put(total)
    done.wait(30)


def test_two_processes_share_one_copy(tiny_root, shm_dir):
    ds = _dataset(tiny_root, (128, 128))
    cache = build_cache(ds, "ram")
    blob = pickle.dumps(cache)
    assert len(blob) < cache.nbytes / 20  # the pages do not travel with the object
    ctx = mp.get_context("fork")
    ready, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_reader, args=(blob, ready, done)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        assert ready.get(timeout=30) == ready.get(timeout=30)
        stats = [_smaps_entry(p.pid, str(cache.path)) for p in procs]
    finally:
        done.set()
        for p in procs:
            p.join(10)
    pages_kb = cache.nbytes // 1024
    for s in stats:
        assert s["Rss"] >= 0.9 * pages_kb  # the whole cache is mapped in each process ...
        assert s["Private_Dirty"] == 0 and s["Private_Clean"] == 0  # ... none of it a private copy ...
        assert s["Shared_Clean"] + s["Shared_Dirty"] == s["Rss"]
        assert s["Pss"] <= 0.55 * s["Rss"]  # ... and its proportional share is split between the two


def test_an_image_rewritten_in_place_changes_the_cache_key(tmp_path):
    """A regenerated set keeps its file names; the cache must not serve the old pixels."""
    import os

    from yolox_fast.data.cache import cache_key

    img = tmp_path / "000001.jpg"
    img.write_bytes(b"old pixels")
    before = cache_key("shapes", [str(img)], (64, 64))
    assert cache_key("shapes", [str(img)], (64, 64)) == before
    img.write_bytes(b"new pixels, other size")
    os.utime(img, ns=(1, 1))
    assert cache_key("shapes", [str(img)], (64, 64)) != before


def _build_as_local_rank_0(root, start, out) -> None:
    """One of two "machines" of torchrun --nnodes 2 on one host: both have LOCAL_RANK 0."""
    import os

    from loguru import logger

    os.environ["LOCAL_RANK"] = "0"
    lines: list = []
    logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    start.wait(30)
    cache = build_cache(_dataset(root, (112, 112)), "ram")
    out.put((sum("building cache" in x for x in lines), str(cache.path), int(np.asarray(cache.array).sum())))


def test_two_local_rank_0_processes_on_one_host_build_one_cache(tiny_root, shm_dir):
    """The builder is whoever takes the file lock first, not "local rank 0": two node agents on one host
    (both local rank 0) share the host's cache, one builds and the other maps what it wrote."""
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_build_as_local_rank_0, args=(tiny_root, start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    try:
        results = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
    assert sorted(built for built, _, _ in results) == [0, 1]  # exactly one of the two built it
    assert len({(path, total) for _, path, total in results}) == 1  # ... and both read the same pixels
    assert len(list(shm_dir.glob("*.bin"))) == 1 and not list(shm_dir.glob("*.tmp-*"))


# ------------------------------------------------------------------------------------------ room
def test_cgroup_v2_and_v1_limits_are_read_from_the_process_cgroup(tmp_path):
    from yolox_fast.utils.cgroup import cgroup_memory

    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/kubepods/pod1\n")
    own = tmp_path / "v2" / "kubepods" / "pod1"
    own.mkdir(parents=True)
    (own / "memory.max").write_text(f"{8 << 30}\n")
    (own / "memory.current").write_text(f"{3 << 30}\n")
    (own / "memory.stat").write_text(f"anon 1\ninactive_file {1 << 30}\n")
    got = cgroup_memory(tmp_path / "v2", proc)
    assert (got.limit, got.used, got.room) == (8 << 30, 2 << 30, 6 << 30)
    (own / "memory.max").write_text("max\n")  # no limit of its own, none at the root: no limit
    assert cgroup_memory(tmp_path / "v2", proc) is None

    proc.write_text("12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n")
    v1 = tmp_path / "v1" / "memory"  # inside a container the mount's root is the container's own cgroup
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{4 << 30}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{1 << 30}\n")
    assert cgroup_memory(tmp_path / "v1", proc).room == 3 << 30
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory(tmp_path / "v1", proc) is None
    assert cgroup_memory(tmp_path / "nowhere", tmp_path / "no_proc") is None


def test_ram_room_counts_the_container_limit_and_the_message_says_what_fits(
    tiny_root, shm_dir, monkeypatch, log_lines
):
    from yolox_fast.utils.cgroup import CgroupMemory

    monkeypatch.setattr(
        cache_mod, "cgroup_memory", lambda: CgroupMemory(1 << 30, 1 << 29, "/fake/memory.max")
    )
    room, where = cache_mod.free_bytes("ram", shm_dir)
    assert room <= 1 << 29 and "container's memory limit of 1.0 GiB (/fake/memory.max)" in where
    # 118,287 images at 640 px need 135 GiB: with 35 GiB of room (34 after the headroom) 320 px fits all,
    # or 34 GiB / 1.2 MB = 29,709 images at 640 px
    text = cache_mod.what_fits(35 << 30, (118_287, 640, 640, 3))
    assert text.startswith(
        "input_size (320, 320) fits all 118287 images, 29709 of the 118287 images fit at 640x640"
    )
    assert "--cache disk" in text
    assert build_cache(_dataset(tiny_root), "ram") is None  # the 1 GiB headroom alone is more than the room
    assert any("WITHOUT a cache" in line and "container's memory limit" in line for line in log_lines)


def _build_under_file_size_limit(root, shm, strict, conn):
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG, as a full /dev/shm gives ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    cache_mod.SHM_DIR = Path(shm)
    try:
        conn.send(("built", build_cache(_dataset(root), "ram", strict=strict) is not None))
    except cache_mod.CacheRoomError as err:
        conn.send(("error", str(err)))


@pytest.mark.parametrize("strict", [False, True])
def test_a_refused_reservation_is_one_clear_message_before_any_image(tiny_root, shm_dir, strict):
    ours, theirs = mp.get_context("fork").Pipe()
    child = mp.get_context("fork").Process(
        target=_build_under_file_size_limit, args=(tiny_root, str(shm_dir), strict, theirs)
    )
    child.start()
    outcome, detail = ours.recv()
    child.join()
    assert child.exitcode == 0  # no bus error, no SIGXFSZ
    if strict:
        assert outcome == "error" and "could not reserve it" in detail and "--cache disk" in detail
    else:
        assert (outcome, detail) == ("built", False)  # went on without a cache
    assert not list(shm_dir.iterdir()) or all(p.name.startswith(".") for p in shm_dir.iterdir())


def test_cache_strict_on_the_command_line_is_one_error_line(tiny_shapes_coco, shm_dir, monkeypatch, tmp_path):
    from helpers import run_tool_here
    from test_trainer import tiny_opts, train_cmd

    monkeypatch.setattr(cache_mod, "free_bytes", lambda mode, folder: (1 << 20, "1 MiB free in test"))
    opts = tiny_opts(tiny_shapes_coco["config"], tmp_path, max_epoch=1) + ["cache_strict", "True"]
    done = run_tool_here("train", *train_cmd(opts, "--cache", "ram")[2:])
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "ram cache of 24 images" in errors[0] and "--cache disk" in errors[0]
