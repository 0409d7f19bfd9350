"""data/datasets/consistency.py and damaged.py: duplicate ids, missing optional fields, sizes that differ
from the file and damaged images counted across processes, each named; the pure rules alone."""

import multiprocessing

import cv2
import numpy as np
import pytest

from yolox_fast.data.datasets.consistency import (
    check_coco_ids,
    check_shared_images,
    differs,
    file_sizes,
    fill_coco_defaults,
    repeated,
)
from yolox_fast.data.datasets.damaged import DamagedImages, TooManyDamagedImages
from yolox_fast.data.datasets.problems import DatasetProblems


def test_repeated_keeps_only_values_seen_twice_or_more():
    assert repeated([3, 1, 3, 2, 1, 3]) == {3: 3, 1: 2} and repeated([1, 2]) == {}


def test_duplicate_image_id_is_an_error_naming_both_files():
    images = [
        {"id": 1, "file_name": "a.jpg"},
        {"id": 2, "file_name": "b.jpg"},
        {"id": 1, "file_name": "c.jpg"},
    ]
    with pytest.raises(ValueError, match=r"x.json: image id 1 is given to 2 images \(a.jpg, c.jpg\)"):
        check_coco_ids(images, [], "x.json", DatasetProblems())


def test_duplicate_annotation_id_is_an_error_naming_its_images():
    anns = [{"id": 7, "image_id": 1}, {"id": 8, "image_id": 1}, {"id": 7, "image_id": 2}]
    with pytest.raises(ValueError, match=r"annotation id 7 is given to 2 annotations \(of image ids 1, 2\)"):
        check_coco_ids([], anns, "x.json", DatasetProblems())


def test_a_collecting_log_lists_every_duplicate():
    problems = DatasetProblems(collect=True)
    images = [{"id": i % 2, "file_name": f"{i}.jpg"} for i in range(4)]
    anns = [{"id": 5, "image_id": 0}] * 3
    check_coco_ids(images, anns, "x.json", problems)
    assert problems.count("duplicate image id") == 2 and problems.count("duplicate annotation id") == 1


def test_missing_iscrowd_and_area_are_read_as_their_defaults():
    anns = [{"id": 1, "bbox": [0, 0, 4, 5]}, {"id": 2, "bbox": [0, 0, 1, 1], "iscrowd": 1, "area": 9}]
    problems = DatasetProblems(collect=True)
    fill_coco_defaults(anns, "x.json", problems)
    assert anns[0]["iscrowd"] == 0 and anns[0]["area"] == 20.0
    assert anns[1]["iscrowd"] == 1 and anns[1]["area"] == 9  # given values stay
    assert "annotation id 1" in problems.first("annotation without `iscrowd`")


def test_differs_accepts_the_decoded_and_the_stored_orientation():
    assert not differs((480, 640), (480, 640), (480, 640))
    assert not differs((640, 480), (480, 640), (640, 480))  # a sideways photo annotated as stored
    assert differs((240, 320), (480, 640), (480, 640))


def test_file_sizes_take_the_file_size_where_the_annotation_is_wrong_or_silent(tmp_path):
    for name, (h, w) in {"a.jpg": (40, 60), "b.jpg": (40, 60), "c.jpg": (40, 60)}.items():
        cv2.imwrite(str(tmp_path / name), np.zeros((h, w, 3), np.uint8))
    entries = [
        (str(tmp_path / "a.jpg"), 60, 40),  # agrees
        (str(tmp_path / "b.jpg"), 120, 80),  # says twice the size
        (str(tmp_path / "c.jpg"), None, None),  # says nothing
        (str(tmp_path / "gone.jpg"), 10, 10),  # missing: the declared size, the dataset names it later
    ]
    problems = DatasetProblems(collect=True)
    assert file_sizes(entries, "x.json", problems) == [(40, 60), (40, 60), (40, 60), (10, 10)]
    assert problems.count("image size differs from its annotation") == 1
    assert "b.jpg: the file is 60x40, x.json says 120x80" in problems.first(
        "image size differs from its annotation"
    )


def test_an_image_claimed_by_two_annotation_files_is_an_error():
    with pytest.raises(ValueError, match=r"a.jpg is the image of 2 VOC annotations \(a.xml, a copy.xml\)"):
        check_shared_images(["a.jpg", "b.jpg", "a.jpg"], ["a.xml", "b.xml", "a copy.xml"], "VOC annotation",
                            DatasetProblems())  # fmt: skip


def _mark_in_child(damaged: DamagedImages, index: int) -> None:
    damaged.mark(index, f"{damaged.file_of(index)}: truncated")


def test_damage_found_in_a_forked_worker_is_seen_by_the_parent():
    damaged = DamagedImages("{}.jpg".format, 10, "train")
    child = multiprocessing.get_context("fork").Process(target=_mark_in_child, args=(damaged, 3))
    child.start()
    child.join()
    assert damaged.count() == 1 and 3 in damaged and damaged.first() == ["3.jpg"]
    assert damaged.summary() == "1 damaged images skipped (first: 3.jpg)"


def test_the_limit_stops_past_its_share_and_always_when_nothing_is_left():
    damaged = DamagedImages("{}.jpg".format, 10, "train")
    damaged.mark(0, "0.jpg: truncated")
    damaged.check(0.1)  # 1 of 10 is not more than 10%
    with pytest.raises(TooManyDamagedImages, match=r"train: 1 of its 10 images are damaged, .* 0.05 .*0.jpg"):
        damaged.check(0.05)
    for i in range(10):
        damaged.mark(i, f"{i}.jpg: truncated")
    with pytest.raises(TooManyDamagedImages, match="none of its 10 images can be decoded"):
        damaged.check(None)
