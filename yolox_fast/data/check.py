"""Check a dataset before training: read an exp's train and val splits, count what is there, list every
problem (not only the first), and draw the labels and a training batch.

The splits are read by the datasets' own parsers with a collecting `DatasetProblems` log, so the
checker and training agree on what a problem is; the checks that need more than one annotation
(duplicates, classes per split) or the exp (box_candidates, max_labels, num_classes) are here.
Errors are what training refuses or cannot learn from (a missing or undecodable image, an unknown
class, a malformed label, a zero-size box); the rest are warnings.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from loguru import logger
from tabulate import tabulate

from yolox_fast.data import check_plots
from yolox_fast.data.build import build_checked_dataset, dataset_config
from yolox_fast.data.datasets.base import DetectionDataset
from yolox_fast.data.datasets.problems import ERROR, WARNING, DatasetProblems
from yolox_fast.data.image_io import (
    ALPHA_BACKGROUND,
    MAX_IMAGE_PIXELS,
    CorruptImageError,
    has_alpha,
    header_sizes,
    image_size,
    native_stderr_lines,
    read_image,
)
from yolox_fast.utils.boxes import bboxes_iou

SPLITS = ("train", "val")
DUPLICATE_IOU = 0.9  # two boxes of one class in one image overlapping this much are one object twice
READ_THREADS = min(8, os.cpu_count() or 1)


@dataclass
class SplitSummary:
    """What one split holds. Box sizes are in pixels after the letterbox resize to the exp's input."""

    images: int
    background: int  # images without boxes
    per_class: np.ndarray  # (K,) boxes of each class
    per_image: np.ndarray  # (N,) boxes of each image
    sizes: np.ndarray  # (M, 2) box width, height in input pixels
    centres: np.ndarray  # (M, 2) box centre x, y normalised by the image size
    would_drop: int  # boxes box_candidates would drop at the input size (see `summarise`)

    @property
    def boxes(self) -> int:
        return int(self.per_image.sum())


@dataclass
class CheckReport:
    """The result of `check_dataset`: per-split summaries, problems by split, files written."""

    dataset: str
    exp_name: str
    class_names: tuple[str, ...]
    settings: dict[str, object]
    summaries: dict[str, SplitSummary] = field(default_factory=dict)
    problems: dict[str, DatasetProblems] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(p.errors for p in self.problems.values())

    @property
    def warnings(self) -> int:
        return sum(p.warnings for p in self.problems.values())

    def format(self) -> str:
        """The report as text: settings, split and class tables, then every problem kind with examples."""
        s = self.settings
        lines = [
            f"dataset {self.dataset}, checked for exp {self.exp_name}: input {s['input_size']}, "
            f"max_labels {s['max_labels']}, num_classes {s['num_classes']}",
            "",
            self._split_table(),
            "",
            f"'would drop': boxes whose shorter side is <= box_min_size={s['box_min_size']} px after the "
            f"letterbox resize to the input, or whose aspect ratio is >= box_max_aspect="
            f"{s['box_max_aspect']} (what box_candidates drops before any augmentation scaling; its "
            "area-ratio test concerns cut boxes only and is not counted).",
            "",
            self._class_table(),
            "",
            self._problem_text(),
        ]
        lines += self.notes
        if self.written:
            lines.append(
                f"wrote {', '.join(Path(p).name for p in self.written)} to {Path(self.written[0]).parent}"
            )
        return "\n".join(lines)

    def _split_table(self) -> str:
        rows = []
        for split in SPLITS:
            m = self.summaries.get(split)
            if m is None:
                rows.append([split, "unreadable", "", "", "", "", ""])
                continue
            mean = m.per_image.mean() if len(m.per_image) else 0.0
            most = int(m.per_image.max()) if len(m.per_image) else 0
            rows.append([split, m.images, m.background, m.boxes, f"{mean:.2f}", most, m.would_drop])
        headers = ["split", "images", "background", "boxes", "boxes/image", "max boxes/image", "would drop"]
        return tabulate(rows, headers=headers, tablefmt="github")

    def _class_table(self) -> str:
        rows = []
        for k, name in enumerate(self.class_names):
            counts = [int(self.summaries[s].per_class[k]) if s in self.summaries else "" for s in SPLITS]
            rows.append([k, name, *counts])
        return tabulate(rows, headers=["id", "class", *(f"{s} boxes" for s in SPLITS)], tablefmt="github")

    def _problem_text(self) -> str:
        lines = [f"{self.errors} errors, {self.warnings} warnings"]
        for severity in (ERROR, WARNING):
            for split, problems in self.problems.items():
                for kind, entry in problems.kinds.items():
                    if entry.severity != severity:
                        continue
                    lines.append(f"{severity.upper():7s} [{split}] {kind}: {entry.count}")
                    lines += [f"          {m}" for m in entry.examples]
                    if entry.count > len(entry.examples):
                        lines.append(f"          ... and {entry.count - len(entry.examples)} more")
        return "\n".join(lines)


# how check_images names each kind of damage `image_io.read_image` refuses
DAMAGE_KINDS = {
    "empty": "empty image file",
    "truncated": "truncated image",
    "undecodable": "unreadable image",
    "too large": "image too large",
}


def _read(path: str, decode: bool) -> tuple[tuple[int, int] | None, CorruptImageError | None]:
    """((h, w) as training reads the file, None) or (None, why it cannot be used)."""
    try:
        if decode:
            return read_image(path).shape[:2], None
        if os.path.getsize(path) == 0:
            raise CorruptImageError(f"{path}: the file is empty (0 bytes)", "empty")
        h, w = image_size(path)
    except CorruptImageError as err:
        return None, err
    except (OSError, ValueError) as err:
        return None, CorruptImageError(f"{path}: cannot be opened ({err})")
    if h * w > MAX_IMAGE_PIXELS:
        return None, CorruptImageError(f"{path}: {w}x{h} pixels, more than {MAX_IMAGE_PIXELS}", "too large")
    return (h, w), None


def check_images(dataset: DetectionDataset, problems: DatasetProblems, decode: bool = True) -> None:
    """Read every image of `dataset` as training does (`image_io.read_image`): an empty, truncated,
    undecodable or oversized one is an error of its kind; one whose size differs from its annotation, or
    with transparency (composited on grey), a warning. `decode=False` reads headers only (fast; a
    truncated file body then goes unnoticed). What the decoding libraries print themselves is kept off
    the terminal and listed as a warning of its own."""
    with native_stderr_lines() as printed, ThreadPoolExecutor(READ_THREADS) as pool:
        results = list(pool.map(lambda path: _read(path, decode), dataset.image_files()))
    for rec, (hw, err) in zip(dataset.records, results):
        annotated = (rec.height, rec.width)
        if err is not None:
            problems.error(DAMAGE_KINDS[err.reason], str(err))
            continue
        if has_alpha(rec.file):
            problems.note(
                "image with transparency",
                f"{rec.file}: has an alpha channel: transparent pixels read as grey {ALPHA_BACKGROUND[0]}",
            )
        if tuple(hw) == annotated[::-1] != annotated and header_sizes(rec.file)[1] == annotated:
            problems.note(
                "image stored sideways, annotated as stored",
                f"{rec.file}: EXIF turns it to {hw[1]}x{hw[0]}, its boxes are drawn on the {rec.width}x"
                f"{rec.height} pixels as stored (as LabelImg does): training and evaluation read it so",
            )
        elif tuple(hw) != annotated:
            problems.note(
                "image size differs from its annotation",
                f"{rec.file}: the file is {hw[1]}x{hw[0]}, the annotation says {rec.width}x{rec.height}",
            )
    for line in printed:
        problems.note("decoder message", f"an image library printed, while the images were read: {line!r}")


def _box(b: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:.1f}" for v in b.tolist()) + "]"


def summarise(dataset: DetectionDataset, exp, problems: DatasetProblems) -> SplitSummary:
    """Counts, sizes and centres of `dataset`'s boxes; notes duplicates, boxes box_candidates would
    drop at exp.input_size (shorter side <= exp.box_min_size after the letterbox resize, or aspect
    >= exp.box_max_aspect), and images with more boxes than exp.max_labels."""
    names = dataset.class_names
    in_h, in_w = exp.input_size
    per_class = np.zeros(len(names), dtype=np.int64)
    per_image, sizes, centres = [], [], []
    would_drop = 0
    for rec in dataset.records:
        boxes = rec.boxes.astype(np.float64)
        per_image.append(len(boxes))
        per_class += np.bincount(rec.classes, minlength=len(names))[: len(names)]
        if not len(boxes):
            continue
        wh = boxes[:, 2:] - boxes[:, :2]
        r = min(in_h / rec.height, in_w / rec.width)
        sizes.append(wh * r)
        centres.append((boxes[:, :2] + boxes[:, 2:]) / 2 / [rec.width, rec.height])
        with np.errstate(divide="ignore", invalid="ignore"):
            aspect = np.maximum(wh[:, 0] / wh[:, 1], wh[:, 1] / wh[:, 0])
        drop = (wh.min(1) * r <= exp.box_min_size) | (aspect >= exp.box_max_aspect)
        would_drop += int(drop.sum())
        for k in np.flatnonzero(drop):
            problems.note(
                "box box_candidates would drop",
                f"{rec.file}: {names[rec.classes[k]]} box {_box(boxes[k])} is {wh[k, 0] * r:.1f}x"
                f"{wh[k, 1] * r:.1f} px at the {in_h}x{in_w} input",
            )
        _note_duplicates(rec.file, boxes, rec.classes, names, problems)
        if len(boxes) > exp.max_labels:
            problems.note(
                "more boxes than max_labels",
                f"{rec.file}: {len(boxes)} boxes, more than exp.max_labels = {exp.max_labels} "
                "(training drops the rest)",
            )
    return SplitSummary(
        images=len(dataset.records),
        background=sum(n == 0 for n in per_image),
        per_class=per_class,
        per_image=np.array(per_image, dtype=np.int64),
        sizes=np.concatenate(sizes) if sizes else np.zeros((0, 2)),
        centres=np.concatenate(centres) if centres else np.zeros((0, 2)),
        would_drop=would_drop,
    )


def _note_duplicates(file: str, boxes: np.ndarray, classes: np.ndarray, names, problems) -> None:
    """Pairs of same-class boxes in one image with IoU > DUPLICATE_IOU (identical ones included)."""
    if len(boxes) < 2 or len(np.unique(classes)) == len(classes):
        return
    iou = bboxes_iou(torch.from_numpy(boxes), torch.from_numpy(boxes)).numpy()
    same = classes[:, None] == classes[None, :]
    for i, j in zip(*np.nonzero(np.triu(same & (iou > DUPLICATE_IOU), k=1))):
        problems.note(
            "duplicate box",
            f"{file}: two {names[classes[i]]} boxes {_box(boxes[i])} and {_box(boxes[j])} "
            f"(IoU {iou[i, j]:.2f} > {DUPLICATE_IOU})",
        )


def check_across_splits(report: CheckReport, datasets: dict[str, DetectionDataset], exp) -> DatasetProblems:
    """What only both splits together show: differing class lists, classes with boxes in one split
    only (or none), and a class count that does not fit exp.num_classes."""
    problems = DatasetProblems(collect=True)
    names = {s: ds.class_names for s, ds in datasets.items()}
    if len(set(names.values())) > 1:
        problems.error(
            "class names differ between splits",
            "; ".join(f"{s}: {list(n)}" for s, n in names.items()),
        )
    num = len(report.class_names)
    if num > exp.num_classes:
        problems.error(
            "more classes than exp.num_classes",
            f"the dataset has {num} classes, exp.num_classes = {exp.num_classes} (training stops)",
        )
    elif num < exp.num_classes:
        problems.note(
            "fewer classes than exp.num_classes",
            f"the dataset has {num} classes, exp.num_classes = {exp.num_classes} (the extra outputs are "
            "never trained)",
        )
    if len(report.summaries) == len(SPLITS):
        train, val = (report.summaries[s].per_class for s in SPLITS)
        for k, name in enumerate(report.class_names):
            if k >= len(train) or k >= len(val):
                continue
            if train[k] and not val[k]:
                problems.note(
                    "class in one split only", f"class {k} {name!r}: {train[k]} train boxes, no val boxes"
                )
            elif val[k] and not train[k]:
                problems.note(
                    "class in one split only", f"class {k} {name!r}: {val[k]} val boxes, never trained"
                )
            elif not train[k] and not val[k]:
                problems.note("class without boxes", f"class {k} {name!r} has no boxes in either split")
    return problems


def check_dataset(
    exp, output_dir: str | Path | None = None, decode: bool = True, samples: int = 16
) -> CheckReport:
    """Read exp's train and val splits (any format) without training; return the report and write
    `labels.png` and `train_batch.png` (`samples` augmented training images, drawn from
    `exp.get_data_loader` as the model sees them) into `output_dir` (default
    `<exp.output_dir>/<exp.exp_name>/dataset_check/`). The built-in synthetic set is generated first
    if missing. `decode=False` opens image headers only."""
    exp.prepare_dataset()
    cfg = dataset_config(exp)
    out = Path(output_dir or Path(exp.output_dir) / exp.exp_name / "dataset_check")
    report = CheckReport(
        dataset=f"{cfg['name']} ({cfg['format']}, {cfg['root']})",
        exp_name=exp.exp_name,
        class_names=tuple(cfg.get("class_names") or ()),
        settings={
            k: getattr(exp, k)
            for k in ("input_size", "max_labels", "num_classes", "box_min_size", "box_max_aspect")
        },
    )
    datasets = {}
    for split in SPLITS:
        problems = report.problems.setdefault(split, DatasetProblems(collect=True))
        logger.info(f"reading the {split} split")
        try:
            dataset = build_checked_dataset(exp, split, problems)
        except Exception as err:  # whatever stops the reader is reported, not raised
            problems.error("unreadable split", f"{type(err).__name__}: {err}")
            continue
        datasets[split] = dataset
        check_images(dataset, problems, decode)
        report.summaries[split] = summarise(dataset, exp, problems)
    report.class_names = next((ds.class_names for ds in datasets.values()), report.class_names)
    report.problems["both"] = check_across_splits(report, datasets, exp)

    out.mkdir(parents=True, exist_ok=True)
    if report.summaries:
        path = out / "labels.png"
        counts = ", ".join(
            f"{sp} {sm.images} images / {sm.boxes} boxes" for sp, sm in report.summaries.items()
        )
        title = f"labels of {cfg['name']} ({counts})"
        check_plots.plot_labels(report.summaries, report.class_names, exp, path, title)
        report.written.append(str(path))
    workers, exp.data_num_workers = exp.data_num_workers, 0  # for one batch, worker start-up costs more
    try:
        loader = exp.get_data_loader(batch_size=samples, is_distributed=False)
        imgs, targets = next(iter(loader))[:2]
    except Exception as err:  # the data problem behind it is in the report
        report.notes.append(f"train_batch.png not written: building a training batch failed: {err}")
    else:
        path = out / "train_batch.png"
        check_plots.plot_train_batch(imgs, targets, report.class_names, exp, path)
        report.written.append(str(path))
    finally:
        exp.data_num_workers = workers
    return report
