"""Nothing silent: damaged images, inconsistent annotations and full disks, each planted in a small set made
here and met with the tools as typed (docs/datasets.md, "Damaged and inconsistent data"). check_dataset
runs as its own process, so that what C libraries print on its stderr is seen too; training runs in this
process (helpers.run_tool_here: the exit code and stderr of a fresh one)."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from helpers import bomb_png, exp_for, run_tool_here
from test_faults import TINY as FAULTS_TINY

from yolox_fast.data.cache import CacheRoomError
from yolox_fast.utils.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
EXP = str(REPO / "exps" / "example" / "shapes_nano.py")
# the fault tests' tiny run, each training sample reading its own image: a damaged one is met in the epoch
TINY = {**FAULTS_TINY, "mosaic_prob": "0.0"}


def train(desc: Path, out: Path, *flags, **overrides):
    pairs = {"dataset": desc, "output_dir": out, **TINY, **overrides}
    opts = [str(x) for kv in pairs.items() for x in kv]
    return run_tool_here("train", "-f", EXP, "-expn", "run", "-b", "2", "-l", "none", *flags, *opts)


def last_line(done) -> str:
    return (done.stderr.strip().splitlines() or [""])[-1]


class Messy:
    """A writable copy of the tiny COCO set whose train split is edited one planted problem at a time."""

    def __init__(self, tiny_shapes_coco: dict, folder: Path) -> None:
        self.root = folder / "data"
        shutil.copytree(tiny_shapes_coco["root"], self.root)
        self.desc = folder / "data.json"
        cfg = json.loads(Path(tiny_shapes_coco["config"]).read_text())
        self.desc.write_text(json.dumps({**cfg, "root": str(self.root)}))
        self.ann_file = self.root / "annotations" / "instances_train2017.json"
        self.ann = json.loads(self.ann_file.read_text())
        self.images = self.root / "train2017"

    def save(self) -> None:
        self.ann_file.write_text(json.dumps(self.ann))

    def truncate(self, name: str) -> Path:
        path = self.images / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path

    def empty(self, name: str) -> Path:
        path = self.images / name
        path.write_bytes(b"")
        return path

    def duplicate_image_id(self) -> str:
        first = self.ann["images"][0]
        shutil.copy(self.images / first["file_name"], self.images / "copy.jpg")
        self.ann["images"].append({**first, "file_name": "copy.jpg"})
        return f"image id {first['id']} is given to 2 images ({first['file_name']}, copy.jpg)"

    def duplicate_annotation_id(self) -> str:
        a, b = self.ann["annotations"][:2]
        b["id"] = a["id"]
        return f"annotation id {a['id']} is given to 2 annotations"

    def misstate_size(self, index: int) -> Path:
        info = self.ann["images"][index]
        info["width"], info["height"] = info["width"] * 2, info["height"] * 2
        return self.images / info["file_name"]

    def transparent_png(self, index: int) -> Path:
        info = self.ann["images"][index]
        bgr = cv2.imread(str(self.images / info["file_name"]))
        alpha = np.full(bgr.shape[:2], 255, np.uint8)
        alpha[: bgr.shape[0] // 2] = 0
        (self.images / info["file_name"]).unlink()
        info["file_name"] = info["file_name"].replace(".jpg", ".png")
        cv2.imwrite(str(self.images / info["file_name"]), np.dstack([bgr, alpha]))
        return self.images / info["file_name"]

    def drop_iscrowd(self, index: int) -> int:
        ann = self.ann["annotations"][index]
        del ann["iscrowd"]
        return ann["id"]

    def bomb(self) -> Path:
        path = bomb_png(self.images / "bomb.png", 40000, 40000)
        self.ann["images"].append({"id": 9999, "file_name": "bomb.png", "width": 40000, "height": 40000})
        return path


@pytest.fixture
def messy(tiny_shapes_coco, tmp_path) -> Messy:
    return Messy(tiny_shapes_coco, tmp_path)


# ------------------------------------------------------------------------------------------ check_dataset
@pytest.mark.slow
def test_check_dataset_lists_every_case_by_file_and_prints_no_bare_library_line(messy, tmp_path):
    truncated = messy.truncate("000003.jpg")
    empty = messy.empty("000004.jpg")
    same_image_id = messy.duplicate_image_id()
    same_ann_id = messy.duplicate_annotation_id()
    resized = messy.misstate_size(6)
    transparent = messy.transparent_png(7)
    no_crowd = messy.drop_iscrowd(5)
    bomb = messy.bomb()
    messy.save()
    cmd = [sys.executable, str(REPO / "tools" / "check_dataset.py"), "--dataset", str(messy.desc),
           "--output", str(tmp_path / "check"), "--samples", "2", "input_size", "(64,64)"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's package, whichever one is installed
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    expected = {
        "ERROR   [train] truncated image: 1": f"{truncated}: truncated",
        "ERROR   [train] empty image file: 1": f"{empty}: the file is empty (0 bytes)",
        "ERROR   [train] duplicate image id: 1": same_image_id,
        "ERROR   [train] duplicate annotation id: 1": same_ann_id,
        "ERROR   [train] image too large: 1": f"{bomb}: 40000x40000 pixels",
        "WARNING [train] image size differs from its annotation: 1": f"{resized}: the file is 128x128, ",
        "WARNING [train] image with transparency: 1": f"{transparent}: has an alpha channel",
        "WARNING [train] annotation without `iscrowd`: 1": f"(first: annotation id {no_crowd})",
    }
    for kind, example in expected.items():
        assert kind in out and example in out, f"{kind}\n{out}"
    for bare in ("Premature end", "libpng", "Corrupt JPEG", "DecompressionBomb", "Traceback"):
        assert bare not in done.stderr, done.stderr[-2000:]


def _copy_description(src: dict, dst: Path) -> Path:
    shutil.copytree(src["root"], dst)
    desc = json.loads((dst / "dataset.json").read_text())
    (dst / "dataset.json").write_text(json.dumps({**desc, "root": str(dst)}))
    return dst / "dataset.json"


def _check_in_process(description: Path, out: Path):
    from yolox_fast.data.check import check_dataset

    return check_dataset(exp_for(str(description)), out, samples=2).problems["train"]


def test_voc_sizes_shared_images_and_damage_are_listed_by_file(tiny_shapes_voc, tmp_path):
    desc = _copy_description(tiny_shapes_voc, tmp_path / "voc")
    voc = tmp_path / "voc" / "VOC2007"
    xml = voc / "Annotations" / "train_000001.xml"
    xml.write_text(xml.read_text().replace("<width>128</width>", "<width>300</width>"))
    shutil.copy(voc / "Annotations" / "train_000002.xml", voc / "Annotations" / "train_copy.xml")
    with open(voc / "ImageSets" / "Main" / "train.txt", "a") as f:
        f.write("train_copy\n")
    cut = voc / "JPEGImages" / "train_000003.jpg"
    cut.write_bytes(cut.read_bytes()[:500])
    train = _check_in_process(desc, tmp_path / "out")
    said = train.first("image size differs from its annotation")
    assert said.startswith(
        f"{voc / 'JPEGImages' / 'train_000001.jpg'}: the file is 128x128, {xml} says 300x128"
    )
    assert f"{voc / 'JPEGImages' / 'train_000002.jpg'} is the image of 2 VOC annotations" in train.first(
        "image shared by annotations"
    )
    assert train.first("truncated image").startswith(f"{cut}: truncated")


def test_yolo_damage_is_listed_by_kind_as_for_any_other_format(tiny_shapes_coco, tmp_path):
    from yolox_fast.data.datasets.coco import COCODataset
    from yolox_fast.data.datasets.yolo import write_yolo_dataset
    from yolox_fast.data.description import read_description

    cfg = read_description(tiny_shapes_coco["config"])
    splits = {s: COCODataset(cfg["root"], cfg[s]["images"], cfg[s]["ann"]) for s in ("train", "val")}
    data_yaml = write_yolo_dataset(tmp_path / "yolo", splits)
    images = sorted((tmp_path / "yolo" / "images" / "train").iterdir())
    images[0].unlink()  # hard-linked to the shared set: replaced, not written through
    images[0].write_bytes(b"")
    cut = images[1].read_bytes()
    images[1].unlink()
    images[1].write_bytes(cut[: len(cut) // 2])
    train = _check_in_process(data_yaml, tmp_path / "out")
    assert train.first("empty image file") == f"{images[0]}: the file is empty (0 bytes)"
    assert train.first("truncated image").startswith(f"{images[1]}: truncated")


def test_training_evaluation_and_the_demo_see_one_transparent_image_alike(messy, log_lines):
    from yolox_fast.core.demo import _read_batches
    from yolox_fast.data.datasets.coco import COCODataset

    png = messy.transparent_png(7)
    cut = messy.truncate("000003.jpg")
    messy.save()
    dataset = COCODataset(str(messy.root), "train2017", messy.ann_file.name, img_size=(128, 128))
    index = [r.file for r in dataset.records].index(str(png))
    trained = dataset.load_image(index)  # what training resizes and evaluation letterboxes
    assert (trained[:64] == 114).all() and trained[64:].std() > 0  # the transparent half is grey
    names, images = next(_read_batches([png, cut], 4))
    assert names == [png] and np.array_equal(images[0], trained)  # the demo: the same pixels
    assert any(f"cannot read image {cut}: {cut}: truncated" in line for line in log_lines)


# ------------------------------------------------------------------------------------------ training
@pytest.mark.slow
def test_training_skips_a_truncated_image_by_name_counts_it_and_reads_the_rest_right(messy, tmp_path):
    truncated = messy.truncate("000003.jpg")
    resized = messy.misstate_size(6)
    messy.transparent_png(7)
    messy.drop_iscrowd(5)
    messy.save()
    done = train(messy.desc, tmp_path / "out", max_corrupt_fraction="0.1")
    assert done.returncode == 0, done.stderr[-3000:]
    named = [line for line in done.stderr.splitlines() if f"{truncated}: truncated" in line]
    assert len(named) == 1 and "skipped (1 of 24 images" in named[0], named  # one warning, at first sight
    assert f"epoch 1/1 finished; 1 damaged images skipped (first: {truncated})" in done.stderr
    assert f"{resized}: the file is 128x128, {messy.ann_file} says 256x256" in done.stderr
    assert "1 annotations have no `iscrowd`" in done.stderr
    assert (tmp_path / "out" / "run" / "latest_ckpt.pth").is_file()


@pytest.mark.slow
def test_more_damage_than_max_corrupt_fraction_stops_in_one_line_not_a_worker_traceback(messy, tmp_path):
    empty = messy.empty("000004.jpg")
    done = train(messy.desc, tmp_path / "out", data_num_workers="2")  # default: 1% of 24 images
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert last_line(done).startswith("error: ") and "1 of its 24 images are damaged" in last_line(done)
    assert "max_corrupt_fraction 0.01" in last_line(done) and str(empty) in last_line(done)


@pytest.mark.slow
@pytest.mark.parametrize("plant", ["duplicate_image_id", "duplicate_annotation_id"])
def test_duplicate_ids_stop_training_at_the_start_naming_them(messy, tmp_path, plant):
    said = getattr(messy, plant)()
    messy.save()
    done = train(messy.desc, tmp_path / "out")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert said in last_line(done) and str(messy.ann_file) in last_line(done)
    assert not (tmp_path / "out" / "run" / "latest_ckpt.pth").exists()


@pytest.mark.slow
def test_ddp_ranks_pool_what_their_workers_found_and_stop_together(messy, tmp_path):
    """Two processes: the damage one rank meets counts for both, and both stop at the epoch's end."""
    empty = messy.empty("000004.jpg")
    pairs = {"dataset": messy.desc, "output_dir": tmp_path / "out", **TINY, "max_corrupt_fraction": "0.0"}
    cmd = [sys.executable, str(REPO / "tools" / "train.py"), "-f", EXP, "-d", "2", "-expn", "run", "-b", "4",
           "-l", "none", *(str(x) for kv in pairs.items() for x in kv)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode != 0
    assert f"1 of its 24 images are damaged, more than max_corrupt_fraction 0 allows (first: {empty})" in (
        done.stderr
    ), done.stderr[-3000:]
    assert "epoch 1/1 finished" not in done.stderr  # decided before the epoch is reported done


# ------------------------------------------------------------------------------------------ full disks
@pytest.mark.slow
def test_a_full_disk_keeps_the_last_checkpoint_and_a_damaged_one_gives_way_to_the_last_good(
    messy, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    assert train(messy.desc, out, save_history_ckpt="true").returncode == 0
    run = out / "run"
    latest = run / "latest_ckpt.pth"
    before = latest.read_bytes()

    def disk_full(obj, f, *args, **kwargs):  # what a full disk does to the write
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", disk_full)
        done = train(messy.desc, out, "--resume", max_epoch="2")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "no space left on" in last_line(
        done
    ) and "the previous latest_ckpt.pth, if any, is intact" in last_line(done)
    assert latest.read_bytes() == before and not list(run.glob(".*.tmp"))

    latest.write_bytes(before[: len(before) // 3])  # damaged, as by a copy cut short
    done = train(messy.desc, out, "--resume", max_epoch="2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"cannot read checkpoint {latest}" in done.stderr
    assert f"resuming instead from {run}/" in done.stderr and "(epoch 2, iteration 0)" in done.stderr
    assert load_checkpoint(latest)["start_epoch"] == 2


@pytest.fixture
def small_tmpfs(tmp_path):
    """A mount point for a tmpfs of the size the test gives (`mount(size_bytes) -> Path`); skips the test
    where this process may not mount (not root, or a container without CAP_SYS_ADMIN)."""
    point = tmp_path / "tmpfs"
    point.mkdir()
    mounted = []

    def mount(size: int) -> Path:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "none", str(point)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for m in mounted:
        subprocess.run(["umount", str(m)], check=True)


@pytest.mark.slow
def test_a_real_full_file_system_keeps_the_last_checkpoint(messy, tmp_path, small_tmpfs):
    """The same on a real file system too small for one more checkpoint: a tmpfs holding the run's files
    and half a checkpoint more."""
    assert train(messy.desc, tmp_path / "out").returncode == 0
    run = tmp_path / "out" / "run"
    files = sum(p.stat().st_size for p in run.iterdir())
    disk = small_tmpfs(files + (run / "latest_ckpt.pth").stat().st_size // 2)
    shutil.copytree(run, disk / "run")
    before = (disk / "run" / "latest_ckpt.pth").read_bytes()
    done = train(messy.desc, disk, "--resume", max_epoch="2")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert last_line(done).startswith(
        f"error: [Errno {errno.ENOSPC}] no space left on {disk / 'run'} while writing"
    )
    assert (disk / "run" / "latest_ckpt.pth").read_bytes() == before
    assert not [p for p in (disk / "run").iterdir() if p.name.endswith(".tmp")]


def test_a_cache_folder_that_fills_up_mid_build_is_cleaned_and_said(tiny_shapes_coco, tmp_path, monkeypatch):
    from yolox_fast.data.build import build_train_dataset
    from yolox_fast.exp import get_exp

    exp = get_exp(EXP)
    exp.merge(["dataset", tiny_shapes_coco["config"], "input_size", "(64,64)"])
    exp.cache_dir, exp.cache_strict = str(tmp_path / "cache"), True

    def full(self):  # the data written back as the disk runs out
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np.memmap, "flush", full)
    filled = r"disk cache: .*cache filled up while .*\.bin was written .* partial file is removed"
    with pytest.raises(CacheRoomError, match=filled):
        build_train_dataset(exp, cache="disk")
    # nothing of the image cache is left (the folder also holds the dataset's saved index and the lock)
    assert [
        p.name for p in (tmp_path / "cache").iterdir() if p.name not in ("index",) and ".lock" not in p.name
    ] == []
    exp.cache_strict = False  # not strict: the run goes on without a cache
    assert build_train_dataset(exp, cache="disk").cache is None
