"""The dataset index: each reader's arrays equal its annotation files image by image; a COCO index is
parsed once, saved, and read back by every later process; a forked worker reading every record stays flat."""

import gc
import json
import multiprocessing as mp
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import psutil
import pytest
from helpers import REPO, exp_for

from yolox_fast.data.build import build_train_dataset
from yolox_fast.data.datasets import coco as coco_mod
from yolox_fast.data.datasets.base import existing_files
from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.datasets.index import IndexBuilder, decode_string, encode_strings
from yolox_fast.data.datasets.index_store import index_root
from yolox_fast.data.datasets.voc import VOCDetection
from yolox_fast.data.datasets.yolo import YOLODataset, write_yolo_dataset
from yolox_fast.data.description import read_description


# ------------------------------------------------------------------------------------------ oracles
def _clipped(boxes, w, h):
    """Boxes (K, 4) float32 clipped to a w x h image, and those with area left (the readers' rule)."""
    b = np.asarray(boxes, np.float32).reshape(-1, 4).copy()
    b[:, [0, 2]] = b[:, [0, 2]].clip(0, w)
    b[:, [1, 3]] = b[:, [1, 3]].clip(0, h)
    return b[(b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])]


def coco_truth_by_image(ann_path, image_dir):
    """{img_id: (file, h, w, boxes, classes)} read from the json the slow obvious way."""
    data = json.loads(Path(ann_path).read_text())
    cat_ids = sorted(c["id"] for c in data["categories"])
    out = {}
    for im in data["images"]:
        boxes, classes = [], []
        for a in data["annotations"]:
            if a["image_id"] != im["id"] or a.get("iscrowd", 0):
                continue
            x, y, w, h = a["bbox"]
            b = _clipped([[x, y, x + w, y + h]], im["width"], im["height"])
            if len(b):
                boxes.append(b[0])
                classes.append(cat_ids.index(a["category_id"]))
        out[im["id"]] = (
            os.path.join(image_dir, im["file_name"]),
            im["height"],
            im["width"],
            np.array(boxes, np.float32).reshape(-1, 4),
            classes,
        )
    return out


def assert_matches(dataset, truth):
    """`dataset`'s records equal `truth` ({img_id or file: (file, h, w, boxes, classes)}) image by image."""
    assert len(dataset) == len(truth)
    for rec in dataset.records:
        file, h, w, boxes, classes = truth[rec.img_id if rec.img_id in truth else rec.file]
        assert (rec.file, rec.height, rec.width) == (file, h, w)
        np.testing.assert_allclose(rec.boxes, boxes, atol=1e-3)
        assert rec.classes.tolist() == list(classes)


def write_coco_set(root: Path, n_images: int, seed: int = 0, touch: bool = True) -> Path:
    """A COCO json of `n_images` (ids shuffled in the file, some without boxes) with crowd boxes, boxes
    reaching out of their image and boxes wholly outside it; image files are empty (never decoded here)."""
    rng = np.random.default_rng(seed)
    images, anns = [], []
    (root / "images").mkdir(parents=True, exist_ok=True)
    for img_id in rng.permutation(n_images) + 1:
        w, h = int(rng.integers(40, 200)), int(rng.integers(40, 200))
        images.append({"id": int(img_id), "file_name": f"{img_id:06d}.jpg", "width": w, "height": h})
        if touch:
            (root / "images" / f"{img_id:06d}.jpg").touch()
        for _ in range(int(rng.integers(0, 6))):
            x, y = float(rng.uniform(-20, w)), float(rng.uniform(-20, h))
            bw, bh = float(rng.uniform(1, 60)), float(rng.uniform(1, 60))
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": int(img_id),
                    "category_id": int(rng.choice([1, 3, 7])),
                    "bbox": [x, y, bw, bh],
                    "area": bw * bh * 0.7,
                    "iscrowd": int(rng.random() < 0.1),
                    "segmentation": [[x, y, x + bw, y, x + bw, y + bh]],
                }
            )
    cats = [{"id": i, "name": f"c{i}", "supercategory": "thing"} for i in (7, 1, 3)]
    path = root / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


# ------------------------------------------------------------------------------------------ COCO
def test_coco_index_equals_the_json_image_by_image_parsed_and_saved(tmp_path):
    ann = write_coco_set(tmp_path, 60)
    truth = coco_truth_by_image(ann, str(tmp_path / "images"))
    parsed = COCODataset(str(tmp_path), "images", str(ann), index_dir=str(tmp_path / "cache"))
    assert_matches(parsed, truth)
    assert parsed.ids == sorted(truth)
    assert parsed.class_names == ("c1", "c3", "c7") and parsed.class_ids == [1, 3, 7]
    saved = COCODataset(str(tmp_path), "images", str(ann), index_dir=str(tmp_path / "cache"))
    assert isinstance(saved.index.boxes.base, np.memmap)  # read from the saved index: a view of its mapping
    assert_matches(saved, truth)


def test_a_saved_index_pickles_as_its_folder(tmp_path):
    import pickle

    ann = write_coco_set(tmp_path, 30)
    index = COCODataset(str(tmp_path), "images", str(ann), index_dir=str(tmp_path / "cache")).index
    blob = pickle.dumps(index)
    assert len(blob) < 1000  # the folder, not the arrays
    back = pickle.loads(blob)
    assert isinstance(back.boxes.base, np.memmap)
    np.testing.assert_array_equal(back.boxes, index.boxes)
    assert back.meta == index.meta


def test_coco_scoring_truth_is_every_annotation_as_the_file_gives_it(tmp_path):
    ann = write_coco_set(tmp_path, 20)
    data = json.loads(ann.read_text())
    gt = COCODataset(str(tmp_path), "images", str(ann), index_dir=str(tmp_path / "cache")).coco
    got = sorted(gt.dataset["annotations"], key=lambda a: a["id"])
    assert len(got) == len(data["annotations"])
    for a, b in zip(got, data["annotations"]):
        assert {k: a[k] for k in ("id", "image_id", "category_id", "iscrowd")} == {
            k: b[k] for k in ("id", "image_id", "category_id", "iscrowd")
        }
        assert a["bbox"] == pytest.approx(b["bbox"]) and a["area"] == pytest.approx(b["area"])
    assert sorted(gt.getImgIds()) == sorted(im["id"] for im in data["images"])


def test_the_json_reader_keeps_the_box_fields_and_skips_the_masks(tmp_path):
    from yolox_fast.data.datasets.coco_json import read_coco_json

    ann = write_coco_set(tmp_path, 5)
    data = read_coco_json(ann)
    full = json.loads(ann.read_text())
    assert all("segmentation" not in a for a in data["annotations"])
    for a, b in zip(data["annotations"], full["annotations"]):
        assert a == {k: b[k] for k in ("id", "image_id", "category_id", "bbox", "area", "iscrowd")}
    assert data["images"] == full["images"] and data["categories"] == full["categories"]
    full["annotations"][2]["bbox"] = "10 10 5 5"  # another type: parsed whole, the reader names it
    ann.write_text(json.dumps(full))
    assert read_coco_json(ann)["annotations"][2]["segmentation"]
    bad = full["annotations"][2]["id"]
    with pytest.raises(ValueError, match=f"annotation id {bad} has bbox '10 10 5 5'"):
        COCODataset(str(tmp_path), "images", str(ann), index_dir=str(tmp_path / "cache"))
    ann.write_text(ann.read_text()[:-20])
    with pytest.raises(ValueError, match="is not valid JSON"):
        read_coco_json(ann)


def test_a_second_start_reads_the_saved_index_and_an_edited_file_is_parsed_again(tmp_path, monkeypatch):
    ann = write_coco_set(tmp_path, 10)
    folder = str(tmp_path / "cache")
    first = COCODataset(str(tmp_path), "images", str(ann), index_dir=folder)

    def no_parse(path):
        raise AssertionError(f"{path} parsed again")

    monkeypatch.setattr(coco_mod, "read_coco_json", no_parse)
    again = COCODataset(str(tmp_path), "images", str(ann), index_dir=folder)
    np.testing.assert_array_equal(again.index.boxes, first.index.boxes)
    data = json.loads(ann.read_text())
    data["annotations"] = data["annotations"][:-1]
    ann.write_text(json.dumps(data))
    with pytest.raises(AssertionError, match="parsed again"):
        COCODataset(str(tmp_path), "images", str(ann), index_dir=folder)
    monkeypatch.undo()
    COCODataset(str(tmp_path), "images", str(ann), index_dir=folder)
    assert len(list((tmp_path / "cache" / "index").glob("instances-*"))) == 1  # the edited file's index only


def _build_in_child(args):
    root, ann, folder = args
    ds = COCODataset(root, "images", ann, index_dir=folder)
    return ds.index.boxes.sum().item(), len(ds)


@pytest.mark.slow
def test_ranks_starting_together_build_one_index(tmp_path):
    ann = write_coco_set(tmp_path, 300)
    folder = tmp_path / "cache"
    with mp.get_context("fork").Pool(3) as pool:
        results = pool.map(_build_in_child, [(str(tmp_path), str(ann), str(folder))] * 3)
    assert len(set(results)) == 1
    saved = list((folder / "index").iterdir())
    assert len([p for p in saved if p.is_dir()]) == 1  # one complete index, no temporary folder left
    assert not [p for p in saved if ".tmp-" in p.name]


def test_the_tool_path_saves_the_index_once_and_a_fresh_process_reads_it(tiny_shapes_coco, tmp_path):
    code = (
        "import sys; sys.path.insert(0, 'tests'); from helpers import exp_for;"
        "from yolox_fast.data.build import build_train_dataset;"
        f"print(len(build_train_dataset(exp_for({tiny_shapes_coco['config']!r}))))"
    )
    env = {**os.environ, "YOLOX_FAST_CACHE": str(tmp_path / "cache")}
    runs = [
        subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == str(tiny_shapes_coco["num_train"])
    assert "parsed in" in runs[0].stderr and "index is saved" in runs[0].stderr
    assert "read its saved index" in runs[1].stderr and "parsed in" not in runs[1].stderr


def test_exp_cache_dir_places_the_index(tiny_shapes_coco, tmp_path):
    exp = exp_for(tiny_shapes_coco["config"], cache_dir=str(tmp_path / "c"))
    build_train_dataset(exp)
    assert index_root(str(tmp_path / "c")) == tmp_path / "c" / "index"
    assert any((tmp_path / "c" / "index").iterdir())


# ---------------------------------------------------------------------------------------- VOC, YOLO, folders
def voc_truth(root, year, split, class_names):
    """{file: (file, h, w, boxes, classes)} of a VOCdevkit split read from its XML files directly."""
    year_dir = Path(root) / f"VOC{year}"
    stems = (year_dir / "ImageSets" / "Main" / f"{split}.txt").read_text().split()
    out = {}
    for stem in stems:
        tree = ET.parse(year_dir / "Annotations" / f"{stem}.xml").getroot()
        w, h = int(tree.findtext("size/width")), int(tree.findtext("size/height"))
        boxes, classes = [], []
        for obj in tree.iter("object"):
            bb = [float(obj.findtext(f"bndbox/{t}")) for t in ("xmin", "ymin", "xmax", "ymax")]
            b = _clipped([[bb[0] - 1, bb[1] - 1, bb[2], bb[3]]], w, h)
            if len(b):
                boxes.append(b[0])
                classes.append(list(class_names).index(obj.findtext("name")))
        file = str(year_dir / "JPEGImages" / tree.findtext("filename"))
        out[file] = (file, h, w, np.array(boxes, np.float32).reshape(-1, 4), classes)
    return out


def test_voc_index_equals_the_xml_files(tiny_shapes_voc):
    cfg = read_description(tiny_shapes_voc["config"])
    for split in ("train", "val"):
        ds = VOCDetection(cfg["root"], cfg[split]["sets"], cfg["class_names"])
        assert_matches(ds, voc_truth(cfg["root"], "2007", split, cfg["class_names"]))
        assert [n for _, n in ds.image_names] == [Path(r.file).stem for r in ds.records]


def test_a_voc_folder_given_as_the_dataset_reads_the_same_index(tiny_shapes_voc):
    exp = exp_for(tiny_shapes_voc["root"])  # a folder: read through the layout table
    ds = build_train_dataset(exp)
    assert_matches(ds, voc_truth(tiny_shapes_voc["root"], "2007", "train", ds.class_names))


def test_yolo_index_equals_the_label_files(tiny_shapes_coco, tmp_path):
    cfg = read_description(tiny_shapes_coco["config"])
    splits = {s: COCODataset(cfg["root"], cfg[s]["images"], cfg[s]["ann"]) for s in ("train", "val")}
    yaml_path = write_yolo_dataset(tmp_path / "yolo", splits)
    for split in ("train", "val"):
        ds = YOLODataset(str(yaml_path.parent), f"images/{split}", cfg["class_names"])
        truth = {}
        for file in sorted((yaml_path.parent / "images" / split).iterdir()):
            h, w = splits[split].records[0].height, splits[split].records[0].width  # the shapes are 128 px
            label = yaml_path.parent / "labels" / split / f"{file.stem}.txt"
            rows = np.loadtxt(label, ndmin=2) if label.exists() else np.zeros((0, 5))
            cx, cy, bw, bh = rows[:, 1] * w, rows[:, 2] * h, rows[:, 3] * w, rows[:, 4] * h
            boxes = _clipped(np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1), w, h)
            truth[str(file)] = (str(file), h, w, boxes, rows[:, 0].astype(int).tolist())
        assert_matches(ds, truth)


# ------------------------------------------------------------------------------------------ pieces
def test_strings_round_trip_through_one_byte_array():
    names = ["a.jpg", "", "dir/é.png", "x" * 300]
    data, offsets = encode_strings(names)
    assert data.dtype == np.uint8 and offsets.tolist()[0] == 0 and len(offsets) == 5
    assert [decode_string(data, offsets, i) for i in range(4)] == names


def test_subset_keeps_each_kept_image_with_its_boxes():
    from yolox_fast.data.datasets.index import ImageRecord

    builder = IndexBuilder()
    for i in range(5):
        boxes = np.arange(4 * i, dtype=np.float32).reshape(i, 4)
        raw = (boxes + 1, np.arange(i), np.zeros(i, bool)) if i == 3 else None
        builder.add(ImageRecord(i, f"f{i}", 10, 20, boxes, np.arange(i), np.zeros(i, bool), raw))
    names = encode_strings([f"name{i}" for i in range(5)])
    index = builder.build({"name_bytes": names[0], "name_offsets": names[1], "split_wide": np.arange(3)})
    sub = index.subset(np.array([True, False, True, True, False]))
    assert sub.img_ids.tolist() == [0, 2, 3] and sub.files() == ["f0", "f2", "f3"]
    assert [sub.string("name", i) for i in range(3)] == ["name0", "name2", "name3"]
    assert sub.split_wide.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(sub.record(2).boxes, index.record(3).boxes)
    np.testing.assert_array_equal(sub.record(2).raw_gt[0], index.record(3).raw_gt[0])
    assert sub.record(1).raw_gt is None and sub.box_counts.tolist() == [0, 2, 3]


def test_existing_files_lists_each_folder_once(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").touch()
    (tmp_path / "a" / "sub").mkdir()
    files = [str(tmp_path / "a" / "x.jpg"), str(tmp_path / "a" / "y.jpg"), str(tmp_path / "a" / "sub")]
    files.append(str(tmp_path / "nowhere" / "z.jpg"))
    assert existing_files(files) == {str(tmp_path / "a" / "x.jpg")}


def test_voc_images_are_found_in_one_listing_of_their_folder(tmp_path):
    from yolox_fast.data.datasets.voc import find_image, folder_listing

    (tmp_path / "a.JPG").touch()
    (tmp_path / "b.png").touch()
    listing = folder_listing(str(tmp_path))
    assert listing == {"a.JPG", "b.png"} and folder_listing(str(tmp_path / "none")) == frozenset()
    assert find_image(str(tmp_path), "x/y/a.JPG", "a", listing) == str(tmp_path / "a.JPG")
    assert find_image(str(tmp_path), None, "b", listing) == str(tmp_path / "b.png")
    assert find_image(str(tmp_path), "c.jpg", "c", listing) is None
    # the listing is what is asked: a name it holds is found without a stat
    assert find_image("/nowhere", "z.jpg", "z", frozenset({"z.jpg"})) == "/nowhere/z.jpg"


# ------------------------------------------------------------------------------------------ memory
def _uss() -> int:
    return psutil.Process().memory_full_info().uss


def _read_everything(dataset, conn) -> None:
    """In a forked worker: USS before and after reading every record (and a full gc) of `dataset`."""
    gc.collect()
    before = _uss()
    for _ in range(2):
        for i in range(len(dataset)):
            dataset.load_anno(i)
            dataset.resized_size(i)
            _ = dataset.records[i].file
    gc.collect()
    conn.send((before, _uss()))
    conn.close()


@pytest.mark.slow
def test_a_forked_worker_reading_every_record_does_not_grow(tmp_path):
    n = 20_000
    ann = write_coco_set(tmp_path, n)
    ds = COCODataset(str(tmp_path), "images", str(ann), index_dir=str(tmp_path / "cache"), img_size=(64, 64))
    for array in ds.index.arrays.values():  # the main process has read every page of the index too,
        np.asarray(array).sum()  # so the worker's pages of it are shared, as with the other workers
    ours, theirs = mp.get_context("fork").Pipe()
    child = mp.get_context("fork").Process(target=_read_everything, args=(ds, theirs))
    child.start()
    before, after = ours.recv()
    child.join()
    # one Python object per image, touched once, copies at least n * 64 bytes (1.2 MiB) of pages: a list of
    # records grew by 9.2 MiB here, the index by 0.2 MiB (the interpreter's own allocations in the loop)
    assert after - before < n * 64, f"the worker grew by {(after - before) / 2**20:.2f} MiB"
