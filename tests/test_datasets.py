"""COCO / VOC datasets on generated shapes sets, the synthetic generator, configs, and bad input."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import exp_for, run_tool_here

from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.datasets.synthetic import (
    MARKER,
    SHAPE_NAMES,
    default_description,
    ensure_generated,
    generate,
    render_image,
)
from yolox_fast.data.datasets.voc import VOCDetection
from yolox_fast.data.description import read_description


def _coco(info, split="train", **kw):
    cfg = read_description(info["config"])
    return COCODataset(cfg["root"], cfg[split]["images"], cfg[split]["ann"], img_size=(128, 128), **kw)


def _voc(info, split="train", **kw):
    cfg = read_description(info["config"])
    return VOCDetection(cfg["root"], cfg[split]["sets"], cfg["class_names"], img_size=(128, 128), **kw)


def _exp(info, **fields):
    return exp_for(info["config"], **fields)


def test_coco_and_voc_loaders_read_the_same_set(tiny_shapes_coco, tiny_shapes_voc):
    coco, voc = _coco(tiny_shapes_coco), _voc(tiny_shapes_voc)
    assert len(coco) == len(voc) == tiny_shapes_coco["num_train"]
    for a, b in zip(coco.records, voc.records):
        np.testing.assert_array_equal(a.boxes, b.boxes)  # VOC's 1-based inclusive boxes come back exactly
        np.testing.assert_array_equal(a.classes, b.classes)
        assert (a.height, a.width) == (b.height, b.width) == (128, 128)
    img, labels, info, _ = coco.pull_item(3)
    assert img.shape == (128, 128, 3) and img.dtype == np.uint8 and info == (128, 128)
    np.testing.assert_allclose(labels[:, :4], coco.records[3].boxes)
    assert (
        len(_coco(tiny_shapes_coco, "val"))
        == len(_voc(tiny_shapes_voc, "val"))
        == tiny_shapes_coco["num_val"]
    )


def test_class_names_round_trip(tiny_shapes_coco, tiny_shapes_voc):
    for info, _fmt in ((tiny_shapes_coco, "coco"), (tiny_shapes_voc, "voc")):
        exp = _exp(info)
        assert exp.get_class_names() == SHAPE_NAMES
        assert exp.get_dataset().class_names == SHAPE_NAMES
        assert exp.get_eval_dataset().class_names == SHAPE_NAMES
    coco = _coco(tiny_shapes_coco)
    assert coco.class_ids == [1, 2, 3, 4, 5, 6]
    assert [c["name"] for c in coco.coco.loadCats(coco.class_ids)] == list(SHAPE_NAMES)


def test_coco_description_without_names_reads_categories(tiny_shapes_coco, tmp_path):
    cfg = json.loads(Path(tiny_shapes_coco["config"]).read_text())
    del cfg["class_names"]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(cfg))
    assert read_description(path)["class_names"] == list(SHAPE_NAMES)


def test_eval_item_is_letterboxed_with_original_targets(tiny_shapes_coco):
    ds = _exp(tiny_shapes_coco, test_size=(96, 64)).get_eval_dataset()
    img, target, info, img_id = ds[0]
    assert img.shape == (3, 96, 64) and img.dtype == np.float32
    assert (img[:, 64:, :] == 114).all()  # 128x128 -> 64x64 pasted top-left, the rest is padding
    assert info == (128, 128) and img_id == ds.records[0].img_id
    np.testing.assert_array_equal(target[:, :4], ds.records[0].boxes)


def test_unknown_config_name_lists_the_known_ones():
    with pytest.raises(FileNotFoundError, match="shapes"):
        read_description("no_such_dataset")


def test_synthetic_is_deterministic_and_boxes_are_tight():
    a = render_image(np.random.default_rng([7, 0, 1]), 160)
    b = render_image(np.random.default_rng([7, 0, 1]), 160)
    c = render_image(np.random.default_rng([8, 0, 1]), 160)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    boxes = a[1]
    assert len(boxes) >= 1 and (boxes[:, 2:] - boxes[:, :2] >= 8 - 2).all()  # 8 px minimum side (rasterised)
    assert (boxes >= 0).all() and (boxes <= 160).all()


def test_synthetic_min_side_sets_the_smallest_shape():
    sides = {}
    for min_side in (8, 16):
        boxes = [render_image(np.random.default_rng([0, 0, i]), 320, 8, min_side)[1] for i in range(40)]
        wh = np.concatenate(boxes)[:, 2:] - np.concatenate(boxes)[:, :2]
        sides[min_side] = wh.max(1)  # the longer side of each box, px
    # a shape of extent s has a box whose longer side is >= 0.75 s (a triangle's, across its height)
    assert (sides[16] >= 0.75 * 16 - 1).all() and (sides[8] < 0.75 * 16 - 1).sum() >= 10
    assert sides[16].max() <= 161 and sides[8].max() <= 161


def test_make_dataset_cli_takes_the_smallest_side(tmp_path):
    out = tmp_path / "big_shapes"
    proc = run_tool_here("make_dataset", "--out", out, "--num-train", 4, "--num-val", 1, "--size", 96,
                         "--min-side", 24)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    anns = json.loads((out / "annotations" / "instances_train2017.json").read_text())["annotations"]
    assert anns and all(max(a["bbox"][2:]) >= 0.75 * 24 - 1 for a in anns)
    assert json.loads((out / MARKER).read_text())["min_side"] == 24
    shipped = read_description("shapes")["synthetic"]
    assert shipped["min_side"] == 16  # the quick-start set; the exp's recipe and its figures assume it


def test_synthetic_writes_every_shape_kind(tiny_shapes_coco):
    classes = np.concatenate([r.classes for r in _coco(tiny_shapes_coco).records])
    assert set(classes.tolist()) == set(range(len(SHAPE_NAMES)))


def test_generation_is_redone_when_incomplete_or_resized(tmp_path):
    cfg = default_description("coco", str(tmp_path / "s"))
    cfg["synthetic"] = {"num_train": 3, "num_val": 2, "size": 64}
    ensure_generated(cfg)
    marker = tmp_path / "s" / MARKER
    first = (tmp_path / "s" / "train2017" / "000001.jpg").read_bytes()
    marker.unlink()  # what a generation killed before its final rename would look like
    (tmp_path / "s.partial-99999").mkdir()  # and its leftover temp folder
    ensure_generated(cfg)
    assert marker.is_file() and (tmp_path / "s" / "train2017" / "000001.jpg").read_bytes() == first
    cfg["synthetic"]["num_train"] = 4
    ensure_generated(cfg)
    assert len(list((tmp_path / "s" / "train2017").glob("*.jpg"))) == 4


@pytest.fixture
def coco_copy(tiny_shapes_coco, tmp_path):
    """A writable copy of the tiny COCO set and its train annotation dict."""
    root = tmp_path / "copy"
    shutil.copytree(tiny_shapes_coco["root"], root)
    ann_path = root / "annotations" / "instances_train2017.json"
    return root, ann_path, json.loads(ann_path.read_text())


def _reload(root, ann_path, ann, **kw):
    ann_path.write_text(json.dumps(ann))
    return COCODataset(str(root), "train2017", ann_path.name, img_size=(128, 128), **kw)


def test_missing_image_names_the_file(coco_copy):
    root, ann_path, ann = coco_copy
    (root / "train2017" / "000002.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="000002.jpg"):
        _reload(root, ann_path, ann)
    assert len(_reload(root, ann_path, ann, skip_corrupt=True)) == len(ann["images"]) - 1


def test_undecodable_image_is_skipped_named_and_marked_damaged(coco_copy, log_lines):
    root, ann_path, ann = coco_copy
    (root / "train2017" / "000001.jpg").write_bytes(b"not a jpeg")
    ds = _reload(root, ann_path, ann)
    img, _labels, _, img_id = ds.pull_item(0)
    assert img_id == 2 and ds.damaged.count() == 1 and 0 in ds.damaged
    assert [line for line in log_lines if "000001.jpg" in line and "skipped" in line]
    ds.pull_item(0)  # known damaged: neither decoded nor warned about again
    assert len([line for line in log_lines if "000001.jpg" in line]) == 1
    img, target, _, _ = ds[0]  # eval: a blank canvas, its ground truth kept
    assert (img == 114).all() and len(target) == len(ds.records[0].boxes)


def test_unknown_category_id_names_the_annotation(coco_copy):
    root, ann_path, ann = coco_copy
    ann["annotations"][4]["category_id"] = 99
    with pytest.raises(ValueError, match=f"annotation id {ann['annotations'][4]['id']} .*99"):
        _reload(root, ann_path, ann)


def test_out_of_image_boxes_are_clipped_and_counted_once(coco_copy, log_lines):
    root, ann_path, ann = coco_copy
    ann["annotations"][0]["bbox"] = [100, 100, 50, 50]  # 128 px image: sticks out right and bottom
    ann["annotations"][1]["bbox"] = [200, 5, 10, 10]  # entirely outside: nothing left
    ds = _reload(root, ann_path, ann)
    first_img = ann["annotations"][0]["image_id"]
    rec = next(r for r in ds.records if r.img_id == first_img)
    assert [100, 100, 128, 128] in rec.boxes.tolist()
    warnings = [line for line in log_lines if "clipped" in line]
    assert len(warnings) == 1 and "2 boxes extend" in warnings[0] and "1 boxes have no area" in warnings[0]
    assert f"first: annotation id {ann['annotations'][0]['id']} (" in warnings[0]  # the first clipped
    assert f"first: annotation id {ann['annotations'][1]['id']} (" in warnings[0]  # the first dropped
    assert "for training" in warnings[0]


def test_negative_width_box_is_named_when_dropped(coco_copy, log_lines):
    root, ann_path, ann = coco_copy
    ann["annotations"][2]["bbox"] = [40, 40, -12, 10]
    _reload(root, ann_path, ann)
    assert any(f"first: annotation id {ann['annotations'][2]['id']} (" in line for line in log_lines)


def test_orphan_annotations_are_named_and_an_all_orphan_split_is_an_error(coco_copy, log_lines):
    root, ann_path, ann = coco_copy
    ann["annotations"][0]["image_id"] += 1000
    ds = _reload(root, ann_path, ann)
    assert sum(len(r.boxes) for r in ds.records) == len(ann["annotations"]) - 1
    warned = [line for line in log_lines if "no image of the file has" in line]
    assert warned and f"annotation id {ann['annotations'][0]['id']}" in warned[0] and "1 of" in warned[0]
    for a in ann["annotations"]:
        a["image_id"] += 1000
    with pytest.raises(ValueError, match="annotations name an image_id.*no usable box left"):
        _reload(root, ann_path, ann)


def test_truncated_annotation_json_names_the_file(coco_copy):
    root, ann_path, ann = coco_copy
    text = ann_path.read_text()
    ann_path.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=f"{ann_path.name} is not valid JSON.*truncated"):
        COCODataset(str(root), "train2017", ann_path.name, img_size=(128, 128))


def test_empty_coco_split_names_the_file(coco_copy):
    root, ann_path, ann = coco_copy
    ann["images"], ann["annotations"] = [], []
    with pytest.raises(ValueError, match="instances_train2017.json.*no images"):
        _reload(root, ann_path, ann)


def test_voc_bad_input_names_the_file(tiny_shapes_voc, tmp_path):
    root = tmp_path / "voc"
    shutil.copytree(tiny_shapes_voc["root"], root)
    main = root / "VOC2007" / "ImageSets" / "Main"
    (main / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty.txt"):
        VOCDetection(str(root), [("2007", "empty")], SHAPE_NAMES)
    with pytest.raises(FileNotFoundError, match="nosuch.txt"):
        VOCDetection(str(root), [("2007", "nosuch")], SHAPE_NAMES)
    xml = root / "VOC2007" / "Annotations" / "train_000000.xml"
    xml.write_text(xml.read_text().replace("<name>", "<name>hexagon_", 1))
    with pytest.raises(ValueError, match="train_000000.xml.*hexagon_"):
        VOCDetection(str(root), [("2007", "train")], SHAPE_NAMES)


def test_exp_overrides_data_dir_and_ann(tiny_shapes_coco, tmp_path):
    root = tmp_path / "moved"
    shutil.copytree(tiny_shapes_coco["root"], root)
    (root / "annotations" / "instances_val2017.json").rename(root / "annotations" / "my_val.json")
    ds = _exp(tiny_shapes_coco, data_dir=str(root), val_ann="my_val.json").get_eval_dataset()
    assert ds.ann_path == str(root / "annotations" / "my_val.json")


def test_shipped_configs_load():
    cfg = read_description("shapes")
    assert cfg["class_names"] == list(SHAPE_NAMES) and cfg["synthetic"]["size"] == 320
    assert read_description("voc")["format"] == "voc" and len(read_description("coco")["class_names"]) == 80


def test_generate_writes_a_usable_description(tmp_path):
    root = generate(
        default_description("voc", str(tmp_path / "v")), {"num_train": 2, "num_val": 1, "size": 64}
    )
    cfg = read_description(root / "dataset.json")
    assert cfg["root"] == str(root) and "synthetic" not in cfg
    assert len(VOCDetection(cfg["root"], cfg["val"]["sets"], cfg["class_names"])) == 1


def _four_class_coco(src: str, dst: Path) -> Path:
    """A copy of a generated COCO set with the user's own 4 categories, non-contiguous ids 3, 7, 11, 20
    (shapes of the other two kinds dropped), as a user's own data would have."""
    shutil.copytree(src, dst)
    ids = {1: 3, 2: 7, 3: 11, 4: 20}
    names = {3: "disc", 7: "box", 11: "wedge", 20: "sparkle"}
    for split in ("train", "val"):
        path = dst / "annotations" / f"instances_{split}2017.json"
        data = json.loads(path.read_text())
        data["categories"] = [{"id": i, "name": n, "supercategory": "x"} for i, n in names.items()]
        data["annotations"] = [
            {**a, "category_id": ids[a["category_id"]]}
            for a in data["annotations"]
            if a["category_id"] in ids
        ]
        path.write_text(json.dumps(data))
    return dst


def test_data_dir_on_the_coco_description_takes_the_sets_own_categories(tiny_shapes_coco, tmp_path):
    root = _four_class_coco(tiny_shapes_coco["root"], tmp_path / "mine")
    exp = _exp(tiny_shapes_coco, dataset="coco", data_dir=str(root), num_classes=4)
    assert exp.get_class_names() == ("disc", "box", "wedge", "sparkle")  # sorted by id, not COCO's 80
    ds = exp.get_dataset()
    assert ds.class_names == ("disc", "box", "wedge", "sparkle") and ds.class_ids == [3, 7, 11, 20]
    assert {int(c) for r in ds.records for c in r.classes} <= {0, 1, 2, 3}
    assert exp.get_eval_dataset().class_names == ds.class_names


def test_explicit_class_names_still_win_over_the_categories(tiny_shapes_coco, tmp_path):
    root = _four_class_coco(tiny_shapes_coco["root"], tmp_path / "mine")
    exp = _exp(
        tiny_shapes_coco, dataset="coco", data_dir=str(root), num_classes=4, class_names=("a", "b", "c", "d")
    )
    assert exp.get_dataset().class_names == ("a", "b", "c", "d")


def test_relative_roots_resolve_against_yolox_datadir_or_the_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("YOLOX_DATADIR", raising=False)
    assert read_description("coco")["root"] == str(tmp_path / "datasets" / "COCO")
    monkeypatch.setenv("YOLOX_DATADIR", "/data/sets")
    assert read_description("voc")["root"] == "/data/sets/VOCdevkit"
    desc = tmp_path / "mine.json"
    desc.write_text(json.dumps({**default_description("coco", "sets/mine"), "class_names": ["a"]}))
    assert read_description(desc)["root"] == str(tmp_path / "sets" / "mine")


def test_reading_a_description_generates_nothing_preparing_does(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOX_DATADIR", str(tmp_path))
    desc = tmp_path / "tiny.json"
    desc.write_text(
        json.dumps(
            {
                **default_description("coco", "$YOLOX_DATADIR/tiny"),
                "synthetic": {"num_train": 3, "num_val": 2, "size": 64},
            }
        )
    )
    exp = _exp({"config": str(desc)})
    exp.get_class_names()
    assert not (tmp_path / "tiny").exists()
    exp.prepare_dataset()
    assert len(exp.get_dataset()) == 3 and len(exp.get_eval_dataset()) == 2


def test_val_boxes_outside_the_image_are_said_to_be_scored_as_given(tiny_shapes_coco, tmp_path, log_lines):
    root = tmp_path / "copy"
    shutil.copytree(tiny_shapes_coco["root"], root)
    val = root / "annotations" / "instances_val2017.json"
    ann = json.loads(val.read_text())
    ann["annotations"][0]["bbox"] = [30, 30, -5, 10]
    val.write_text(json.dumps(ann))
    exp = _exp(tiny_shapes_coco, data_dir=str(root))
    ds = exp.get_eval_dataset()
    assert any(a["bbox"] == [30, 30, -5, 10] for a in ds.coco.dataset["annotations"])  # scored as given
    said = [line for line in log_lines if "instances_val2017.json" in line and "no area" in line]
    assert (
        said and "scores them as the annotation file gives them" in said[0] and "for training" not in said[0]
    )


@pytest.mark.parametrize("fmt", ["voc", "yolo"])
def test_make_dataset_tool_writes_a_readable_set(fmt, tmp_path, capsys):
    from yolox_fast.tools import make_dataset

    out = tmp_path / fmt
    make_dataset.main(
        ["--format", fmt, "--out", str(out), "--num-train", "3", "--num-val", "2", "--size", "64"]
    )
    description = capsys.readouterr().out.strip().split("dataset description: ")[-1]
    cfg = read_description(description)
    assert cfg["format"] == fmt and cfg["class_names"] == list(SHAPE_NAMES)
    train = exp_for(description).get_dataset()
    assert len(train) == 3 and sum(len(r.boxes) for r in train.records) > 0


def test_the_voc_zoo_exp_reads_vocdevkit_with_the_devkit_metric():
    from yolox_fast.exp import get_exp

    exp = get_exp(None, "yolox-voc-s")
    assert (exp.num_classes, exp.dataset) == (20, "voc")
    cfg = read_description(exp.dataset, class_names=False)
    assert cfg["val"] == {"sets": [["2007", "test"]]} and len(cfg["class_names"]) == 20
