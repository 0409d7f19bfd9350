"""Shared fixtures: tiny generated shapes datasets in COCO and VOC format (session-scoped, < 1 s each)."""

import os
import signal

import pytest

if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    # each worker (and each tool it starts) gets its share of the cores: with every worker at torch's
    # default of one thread per core, each spins on cores the others hold (on a 2-core CPU the suite took
    # 17.6 minutes that way, 11.7 with one thread a worker)
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // _workers))

import torch  # noqa: E402

from yolox_fast.data.datasets.synthetic import default_description, generate

TINY = {"num_train": 24, "num_val": 8, "size": 128, "seed": 0, "max_objects": 6}


@pytest.fixture(scope="session", autouse=True)
def index_cache(tmp_path_factory):
    """The suite's saved dataset indexes go to a folder of its own (not ~/.cache/yolox_fast), set in the
    environment so the tools the tests start as subprocesses use it too."""
    folder = tmp_path_factory.mktemp("yolox_fast_cache")
    previous = os.environ.get("YOLOX_FAST_CACHE")
    os.environ["YOLOX_FAST_CACHE"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("YOLOX_FAST_CACHE", None)
    else:
        os.environ["YOLOX_FAST_CACHE"] = previous


def _tiny_shapes(tmp_path_factory, fmt: str) -> dict:
    root = tmp_path_factory.mktemp(f"shapes_{fmt}") / "shapes"
    generate(default_description(fmt, str(root), name=f"tiny_shapes_{fmt}"), TINY)
    return {"config": str(root / "dataset.json"), "root": str(root), **TINY}


@pytest.fixture(scope="session")
def tiny_shapes_coco(tmp_path_factory) -> dict:
    """{"config": dataset.json path (use as exp.dataset), "root": ..., and the TINY sizes} of a COCO-format
    shapes set: 24 train + 8 val images of 128 px, 6 classes."""
    return _tiny_shapes(tmp_path_factory, "coco")


@pytest.fixture(scope="session")
def tiny_shapes_voc(tmp_path_factory) -> dict:
    """The same set as tiny_shapes_coco, written in VOC format (VOC2007/ImageSets/Main/{train,val}.txt)."""
    return _tiny_shapes(tmp_path_factory, "voc")


@pytest.fixture
def log_lines():
    """Messages logged through loguru while the test runs (a list that fills as it goes)."""
    from loguru import logger

    lines: list = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="DEBUG")
    yield lines
    logger.remove(sink)


@pytest.fixture(autouse=True)
def default_sigchld():
    """Each test ends with SIGCHLD at its default. torch's DataLoader installs a SIGCHLD handler for the life
    of the process the first time it starts workers; in a process that has also loaded OpenVINO's CPU
    plugin, a later child's exit under that handler crashes the process (seen in this suite: test_export,
    then test_loader, then test_run_lock's subprocesses). A tool run is one process doing one job and never
    meets that sequence; the suite runs them all in one."""
    yield
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def torch_threads():
    """Each test ends with torch's thread count as it found it. The benchmarks' --threads 1, run in this
    process, set it for the process (right for a tool run, which is one process doing one job): every later
    test would run its tensors on one core of two."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
