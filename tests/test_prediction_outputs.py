"""The demo's label files, crops, class filter, cap and summary lines; the YOLO, VOC and COCO files it writes
read back by our own dataset readers as a dataset with the demo's boxes."""

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import load_tool
from scipy.optimize import linear_sum_assignment
from test_export import _lively_nano

from yolox_fast.core.prediction_outputs import (
    inside_image,
    select_detections,
    summary_line,
    voc_xml,
    yolo_lines,
)
from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.datasets.voc import VOCDetection
from yolox_fast.data.datasets.yolo import YOLODataset

NAMES = ["circle", "square", "triangle", "star", "cross", "ring"]
DETS = np.array([[10.0, 20.0, 50.0, 60.0, 0.9, 1], [-5.0, 0.0, 30.0, 110.0, 0.4, 0], [0, 0, 8, 8, 0.7, 1]])


def test_yolo_lines_are_normalised_clipped_and_optionally_scored():
    lines = yolo_lines(inside_image(DETS[:2], (100, 200)), (100, 200), save_conf=True)
    assert lines[0] == "1 0.150000 0.400000 0.200000 0.400000 0.90000"
    assert lines[1].split()[:5] == [
        "0",
        "0.075000",
        "0.500000",
        "0.150000",
        "1.000000",
    ]  # clipped to the image
    assert len(yolo_lines(DETS[:1], (100, 200), save_conf=False)[0].split()) == 5


def test_voc_xml_has_one_based_corners_names_and_size():
    root = ET.fromstring(voc_xml("a.jpg", (100, 200), DETS[:1], NAMES))
    assert root.findtext("filename") == "a.jpg" and root.findtext("size/width") == "200"
    box = root.find("object/bndbox")
    assert [box.findtext(t) for t in ("xmin", "ymin", "xmax", "ymax")] == ["11.00", "21.00", "50.00", "60.00"]
    assert root.findtext("object/name") == "square"


def test_class_filter_then_best_n_and_the_summary_line():
    kept = select_detections(DETS, classes=[1], max_det=1)
    np.testing.assert_array_equal(kept, DETS[:1])
    assert len(select_detections(DETS, None, None)) == 3
    assert summary_line("a.jpg", DETS, NAMES, 12.34) == "a.jpg: 2 square, 1 circle (12.3 ms)"
    assert summary_line("frame 3", DETS[:0], NAMES, 1.0) == "frame 3: no detections (1.0 ms)"


def _expected(detections: dict, sizes: dict) -> dict:
    """The demo's JSON boxes as a dataset reader holds them: clipped to the image, empty ones dropped."""
    out = {}
    for name, dets in detections.items():
        h, w = sizes[name]
        boxes = np.array([d["bbox"] for d in dets]).reshape(-1, 4)
        boxes = np.clip(boxes, 0, [w, h, w, h])
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        out[name] = (boxes[keep], np.array([d["class_id"] for d in dets])[keep])
    return out


def _check(dataset, expected: dict, images_dir: Path, atol: float) -> None:
    """Every record holds the demo's boxes of its image: one to one, same class, corners within `atol`."""
    assert len(dataset.records) == len(expected)
    for rec in dataset.records:
        boxes, classes = expected[str(Path(rec.file).relative_to(images_dir))]
        assert len(rec.boxes) == len(boxes)
        # many boxes share corners (clipped to the image): pair them by distance, not by a sort order
        cost = np.abs(rec.boxes[:, None, :] - boxes[None, :, :]).max(-1)  # (K, K) largest corner difference
        cost = cost + 1e3 * (rec.classes[:, None] != classes[None, :])
        rows, cols = linear_sum_assignment(cost)
        assert cost[rows, cols].max() <= atol, (rec.file, cost[rows, cols].max())


@pytest.mark.slow
def test_demo_labels_round_trip_through_our_yolo_voc_and_coco_readers(tiny_shapes_coco, tmp_path):
    _, model = _lively_nano(tiny_shapes_coco["config"], 64)
    ckpt = tmp_path / "lively.pth"
    torch.save({"model": model.state_dict(), "class_names": NAMES}, ckpt)
    images = Path(tiny_shapes_coco["root"]) / "val2017"
    # no --save-conf: a score column is for people, a training label reader takes 5 values a line
    flags = ["--save-txt", "--save-voc", "--save-coco", "--save-crop", "--save-json"]
    common = ["-n", "yolox-nano", "-c", str(ckpt), "--tsize", "64", "--conf", "0.2", "num_classes", "6"]
    common += ["output_dir", str(tmp_path), "dataset", tiny_shapes_coco["config"]]
    load_tool("demo").main(["image", "--path", str(images), *flags, *common, "-expn", "all"])
    (out,) = (tmp_path / "all" / "vis_res").glob("*")
    detections = json.loads((out / "detections.json").read_text())
    assert sum(map(len, detections.values())) > 0
    sizes = {name: (128, 128) for name in detections}  # the tiny set's images are 128 x 128
    expected = _expected(detections, sizes)

    # YOLO: images/ beside the labels/ the demo wrote is an Ultralytics split
    shutil.copytree(images, out / "images")
    _check(YOLODataset(str(out), "images", NAMES), expected, out / "images", atol=0.02)
    # VOC: Annotations/ the demo wrote, the images where they are
    split = {"images": str(images), "annotations": "Annotations"}
    _check(VOCDetection(str(out), split, NAMES), expected, images, atol=0.02)
    # COCO: one json of the folder's predictions
    coco = COCODataset(str(images.parent), "val2017", str(out / "predictions_coco.json"), class_names=NAMES)
    _check(coco, expected, images, atol=0.02)
    crops = list((out / "crops").rglob("*.jpg"))
    assert len(crops) == sum(len(boxes) for boxes, _ in expected.values())
    assert {c.parent.name for c in crops} <= set(NAMES)

    load_tool("demo").main(["image", "--path", str(images), "--classes", "0", "2", "--max-det", "1",
                            "--save-json", *common, "-expn", "some"])  # fmt: skip
    (saved,) = (tmp_path / "some" / "vis_res").glob("*/detections.json")
    for name, dets in json.loads(saved.read_text()).items():
        assert len(dets) <= 1 and {d["class_id"] for d in dets} <= {0, 2}
        everything = [d for d in detections[name] if d["class_id"] in (0, 2)]
        assert [d["score"] for d in dets] == [max((d["score"] for d in everything), default=None)][
            : len(dets)
        ]
