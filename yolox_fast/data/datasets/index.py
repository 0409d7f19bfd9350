"""DatasetIndex: a split's images and boxes as a few flat arrays, never one Python object per image.

Every reader (COCO, VOC, YOLO) produces one. N images, M boxes:

    img_ids (N,) int64    heights, widths (N,) int32    files: UTF-8 bytes (P,) uint8 + file_offsets (N+1,)
    boxes (M, 4) float32 x1, y1, x2, y2    classes (M,) int64    difficult (M,) bool
    box_offsets (N+1,) int64: image i owns boxes[box_offsets[i]:box_offsets[i + 1]]
    raw_*: the ground truth as the annotation file gives it, for the images whose boxes cleaning changed
           (clipped or dropped); raw_offsets gives an empty range for the others

plus `extra` arrays a format adds (COCO's scoring ground truth, VOC's result names) and `meta`, a small
JSON-able dict (class names, the log lines of the parse). Records are built on demand (`record(i)`), so
a forked loader worker that reads every image touches only array pages, which it never writes: its
memory does not grow with the images it has read (CPython's reference counts would write into the pages
of one object per image). `save` writes one `.npy` per array and `load` memory-maps them read-only:
every rank and worker of a machine then shares one copy of the index.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class ImageRecord:
    """One image and its ground truth, in original pixels."""

    img_id: int
    file: str  # absolute path
    height: int
    width: int
    boxes: np.ndarray  # (K, 4) float32 x1, y1, x2, y2, clipped to the image
    classes: np.ndarray  # (K,) int64 contiguous class index
    difficult: np.ndarray  # (K,) bool (VOC "difficult"; all False for COCO)
    # (boxes, classes, difficult) exactly as the annotation file gives them, where cleaning changed them:
    # what an evaluation scores (VOC; COCO scores its json through pycocotools)
    raw_gt: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


# the arrays every index has, with their dtypes
CORE = {
    "img_ids": np.int64,
    "heights": np.int32,
    "widths": np.int32,
    "file_bytes": np.uint8,
    "file_offsets": np.int64,
    "box_offsets": np.int64,
    "boxes": np.float32,
    "classes": np.int64,
    "difficult": np.bool_,
    "raw_offsets": np.int64,
    "raw_boxes": np.float32,
    "raw_classes": np.int64,
    "raw_difficult": np.bool_,
}


def encode_strings(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes (P,) uint8, offsets (len + 1,) int64) of `strings` as UTF-8, end to end."""
    encoded = [s.encode() for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets


def decode_string(data: np.ndarray, offsets: np.ndarray, i: int) -> str:
    """String i of an `encode_strings` pair."""
    return data[offsets[i] : offsets[i + 1]].tobytes().decode()


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """(N + 1,) int64 start offsets of N consecutive runs of `counts` items."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


@dataclass
class DatasetIndex:
    """The arrays of one split (see the module docstring); `arrays` holds CORE and the format's extras."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None  # where the arrays are mapped from (`load`); None: in memory

    def __post_init__(self) -> None:
        missing = [name for name in CORE if name not in self.arrays]
        if missing:
            raise ValueError(f"dataset index lacks the arrays {missing}")

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("arrays")
        if arrays is not None and name in arrays:
            return arrays[name]
        raise AttributeError(name)

    def __len__(self) -> int:
        return len(self.arrays["img_ids"])

    def __getstate__(self) -> dict[str, Any]:
        # a mapped index pickles as its folder (a spawned worker maps the same pages), never as a copy
        if self.folder is not None:
            return {"folder": self.folder}
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        if set(state) == {"folder"}:
            state = DatasetIndex.load(state["folder"]).__dict__
        self.__dict__.update(state)

    @property
    def box_counts(self) -> np.ndarray:
        """(N,) boxes per image."""
        return np.diff(self.arrays["box_offsets"])

    def file(self, i: int) -> str:
        return self.string("file", i)

    def files(self) -> list[str]:
        return [self.file(i) for i in range(len(self))]

    def record(self, i: int) -> ImageRecord:
        """The ImageRecord of image i, built now from the arrays (its arrays are private copies)."""
        a = self.arrays
        lo, hi = a["box_offsets"][i], a["box_offsets"][i + 1]
        rlo, rhi = a["raw_offsets"][i], a["raw_offsets"][i + 1]
        raw = None
        if rhi > rlo:
            raw = (
                np.array(a["raw_boxes"][rlo:rhi]),
                np.array(a["raw_classes"][rlo:rhi]),
                np.array(a["raw_difficult"][rlo:rhi]),
            )
        return ImageRecord(
            img_id=int(a["img_ids"][i]),
            file=self.file(i),
            height=int(a["heights"][i]),
            width=int(a["widths"][i]),
            boxes=np.array(a["boxes"][lo:hi]),
            classes=np.array(a["classes"][lo:hi]),
            difficult=np.array(a["difficult"][lo:hi]),
            raw_gt=raw,
        )

    def string(self, column: str, i: int) -> str:
        """String i of the per-image string column `column` (arrays `<column>_bytes`, `<column>_offsets`)."""
        return decode_string(self.arrays[f"{column}_bytes"], self.arrays[f"{column}_offsets"], i)

    def subset(self, keep: np.ndarray) -> DatasetIndex:
        """The index of the images where `keep` (N,) bool is True, in memory. Per-image string columns
        (`<column>_bytes` with `<column>_offsets`) are cut with the images; other extras are carried over
        unchanged (they belong to the split: COCO's scoring ground truth)."""
        keep = np.asarray(keep, dtype=bool)
        a = self.arrays
        out = dict(a)
        for name in ("img_ids", "heights", "widths"):
            out[name] = np.array(a[name][keep])
        for column in [k[: -len("_bytes")] for k in a if k.endswith("_bytes") and f"{k[:-6]}_offsets" in a]:
            kept = [self.string(column, i) for i in np.flatnonzero(keep)]
            out[f"{column}_bytes"], out[f"{column}_offsets"] = encode_strings(kept)
        for prefix, offsets in (("", "box_offsets"), ("raw_", "raw_offsets")):
            starts, ends = a[offsets][:-1][keep], a[offsets][1:][keep]
            take = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)] + [np.zeros(0, np.int64)])
            out[offsets] = offsets_of(ends - starts)
            for name in ("boxes", "classes", "difficult"):
                out[prefix + name] = np.array(a[prefix + name][take.astype(np.int64)])
        return DatasetIndex(out, dict(self.meta))

    def save(self, folder: Path) -> None:
        """One `<name>.npy` per array and `meta.json` in `folder` (which must not hold an index yet)."""
        folder.mkdir(parents=True, exist_ok=True)
        for name, array in self.arrays.items():
            np.save(folder / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
        (folder / "meta.json").write_text(json.dumps(self.meta))

    @classmethod
    def load(cls, folder: Path) -> DatasetIndex:
        """The index `save` wrote to `folder`, its arrays memory-mapped read-only."""
        meta = json.loads((folder / "meta.json").read_text())
        arrays = {}
        for entry in os.scandir(folder):
            if entry.name.endswith(".npy"):
                array = np.load(entry.path, mmap_mode="r", allow_pickle=False)
                # an empty array cannot be mapped (numpy reads it): either way it is read-only. A plain
                # ndarray view of the mapping: np.memmap's Python-level indexing cost 0.1 ms per sample
                arrays[entry.name[: -len(".npy")]] = array.view(np.ndarray)
        return cls(arrays, meta, Path(folder))


class IndexBuilder:
    """Collects a split's images one at a time (the readers that parse one file per image) into a
    DatasetIndex; per-image arrays are concatenated once, in `build`."""

    def __init__(self) -> None:
        self.img_ids: list[int] = []
        self.heights: list[int] = []
        self.widths: list[int] = []
        self.files: list[str] = []
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("boxes", "classes", "difficult", "raw_boxes", "raw_classes", "raw_difficult")
        }

    def __len__(self) -> int:
        return len(self.img_ids)

    def add(self, record: ImageRecord) -> None:
        self.img_ids.append(int(record.img_id))
        self.heights.append(int(record.height))
        self.widths.append(int(record.width))
        self.files.append(record.file)
        raw = record.raw_gt or (np.zeros((0, 4)), np.zeros(0), np.zeros(0))
        for prefix, (boxes, classes, difficult) in (
            ("", (record.boxes, record.classes, record.difficult)),
            ("raw_", raw),
        ):
            self.parts[prefix + "boxes"].append(np.asarray(boxes, np.float32).reshape(-1, 4))
            self.parts[prefix + "classes"].append(np.asarray(classes, np.int64).reshape(-1))
            self.parts[prefix + "difficult"].append(np.asarray(difficult, bool).reshape(-1))

    def build(self, extra: dict[str, np.ndarray] | None = None, meta: dict[str, Any] | None = None):
        """The DatasetIndex of the images added so far."""
        arrays: dict[str, np.ndarray] = {
            "img_ids": np.array(self.img_ids, dtype=np.int64),
            "heights": np.array(self.heights, dtype=np.int32),
            "widths": np.array(self.widths, dtype=np.int32),
        }
        arrays["file_bytes"], arrays["file_offsets"] = encode_strings(self.files)
        for prefix in ("", "raw_"):
            boxes = self.parts[prefix + "boxes"]
            arrays[prefix + "box_offsets" if not prefix else "raw_offsets"] = offsets_of(
                np.array([len(b) for b in boxes], dtype=np.int64)
            )
            for name, dtype, shape in (("boxes", np.float32, (0, 4)), ("classes", np.int64, (0,))):
                parts = self.parts[prefix + name]
                joined = np.concatenate(parts) if parts else np.zeros(shape)
                arrays[prefix + name] = joined.astype(dtype)
            parts = self.parts[prefix + "difficult"]
            arrays[prefix + "difficult"] = np.concatenate(parts) if parts else np.zeros(0, bool)
        arrays.update(extra or {})
        return DatasetIndex(arrays, meta or {})


class RecordView(Sequence):
    """`dataset.records`: the index read as a sequence of ImageRecords, each built when asked for."""

    def __init__(self, index: DatasetIndex) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.index.record(j) for j in range(len(self))[i]]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} of {n}")
        return self.index.record(i % n)

    def __iter__(self) -> Iterator[ImageRecord]:
        for i in range(len(self)):
            yield self.index.record(i)
