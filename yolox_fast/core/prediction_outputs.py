"""What the demo writes from its predictions besides pictures: labels a labelling tool or the next training
round imports (YOLO txt, VOC XML, one COCO JSON), crops of the detected objects, and one summary line per
image or frame; and the class filter and per-image cap applied before any of it.

Layout under the run's output folder, each image named by its path relative to the input folder:
`labels/<name>.txt` (YOLO: `class cx cy w h [score]`, normalised to the image), `Annotations/<name>.xml`
(VOC: 1-based pixel corners, as LabelImg and CVAT write them), `predictions_coco.json` (COCO: images,
annotations with `bbox` [x, y, w, h] and `score`, categories with ids 1..K), `crops/<class>/<stem>_<k>.jpg`.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from yolox_fast.utils.visualize import class_name


@dataclass(frozen=True)
class OutputOptions:
    """Which label files to write and which detections to keep (see the module docstring)."""

    save_txt: bool = False
    save_conf: bool = False
    save_voc: bool = False
    save_coco: bool = False
    save_crop: bool = False
    classes: tuple[int, ...] | None = None  # class indices kept; None keeps all
    max_det: int | None = None  # best-scored detections kept per image

    @property
    def writes(self) -> bool:
        return self.save_txt or self.save_voc or self.save_coco or self.save_crop


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's flags for label files, crops, the class filter and the per-image cap."""
    p.add_argument("--save-txt", action="store_true", help="YOLO labels per image under labels/")
    p.add_argument("--save-conf", action="store_true", help="--save-txt: the score as a 6th column")
    p.add_argument("--save-voc", action="store_true", help="VOC XML per image under Annotations/")
    p.add_argument("--save-coco", action="store_true", help="all images' detections in predictions_coco.json")
    p.add_argument("--save-crop", action="store_true", help="each detection cut out under crops/<class>/")
    p.add_argument("--classes", type=int, nargs="+", default=None, help="keep these class indices only")
    p.add_argument("--max-det", type=int, default=None, help="keep the N best detections per image")


def output_options(args: argparse.Namespace) -> OutputOptions:
    """OutputOptions from the flags `add_output_arguments` added."""
    if args.max_det is not None and args.max_det < 1:
        raise ValueError(f"--max-det must be >= 1, got {args.max_det}")
    classes = tuple(args.classes) if args.classes else None
    return OutputOptions(
        args.save_txt, args.save_conf, args.save_voc, args.save_coco, args.save_crop, classes, args.max_det
    )


def select_detections(dets: np.ndarray, classes: Sequence[int] | None, max_det: int | None) -> np.ndarray:
    """(K, 6) detections of `classes` only (all if None), the `max_det` best-scored (all if None)."""
    if classes is not None:
        dets = dets[np.isin(dets[:, 5].astype(int), list(classes))]
    if max_det is not None and len(dets) > max_det:
        dets = dets[np.argsort(-dets[:, 4], kind="stable")[:max_det]]
    return dets


def summary_line(name: str, dets: np.ndarray, class_names: Sequence[str], ms: float) -> str:
    """ "<name>: 2 circle, 1 square (12.3 ms)" (classes by count, then name), or "no detections"."""
    counts = Counter(class_name(class_names, int(c)) for c in dets[:, 5])
    found = ", ".join(f"{n} {c}" for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{name}: {found or 'no detections'} ({ms:.1f} ms)"


def inside_image(dets: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """(K', 6) detections clipped to an image of size `hw` (h, w), those with no area inside it dropped:
    what a label file can hold (a label reader clips, and drops what is left empty, the same way)."""
    h, w = hw
    dets = dets.copy()
    dets[:, [0, 2]] = np.clip(dets[:, [0, 2]], 0, w)
    dets[:, [1, 3]] = np.clip(dets[:, [1, 3]], 0, h)
    return dets[(dets[:, 2] > dets[:, 0]) & (dets[:, 3] > dets[:, 1])]


def yolo_lines(dets: np.ndarray, hw: tuple[int, int], save_conf: bool) -> list[str]:
    """YOLO label lines of (K, 6) detections inside an image of size `hw` (h, w) (see `inside_image`):
    `cls cx cy w h [score]`, normalised to the image."""
    h, w = hw
    lines = []
    for x1, y1, x2, y2, score, cls in dets.tolist():
        values = ((x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h)
        line = f"{int(cls)} " + " ".join(f"{v:.6f}" for v in values)
        lines.append(line + (f" {score:.5f}" if save_conf else ""))
    return lines


def voc_xml(file_name: str, hw: tuple[int, int], dets: np.ndarray, class_names: Sequence[str]) -> str:
    """A VOC annotation of (K, 6) detections: 1-based corners (xmin = x1 + 1, xmax = x2, as the VOC reader
    reads them back), two decimals, each object's score kept in a <score> element labelling tools ignore."""
    root = ET.Element("annotation")
    ET.SubElement(root, "filename").text = file_name
    size = ET.SubElement(root, "size")
    for tag, value in (("width", hw[1]), ("height", hw[0]), ("depth", 3)):
        ET.SubElement(size, tag).text = str(value)
    for x1, y1, x2, y2, score, cls in dets.tolist():
        obj = ET.SubElement(root, "object")
        ET.SubElement(obj, "name").text = class_name(class_names, int(cls))
        ET.SubElement(obj, "difficult").text = "0"
        ET.SubElement(obj, "score").text = f"{score:.5f}"
        box = ET.SubElement(obj, "bndbox")
        for tag, value in (("xmin", x1 + 1), ("ymin", y1 + 1), ("xmax", x2), ("ymax", y2)):
            ET.SubElement(box, tag).text = f"{value:.2f}"
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


class PredictionWriter:
    """Writes each image's detections in the formats `options` asks for, under `out_dir`; `close` writes the
    COCO file. Boxes are (K, 6) [x1, y1, x2, y2, score, class] in the image's pixels."""

    def __init__(self, out_dir: Path, class_names: Sequence[str], options: OutputOptions) -> None:
        self.out_dir = Path(out_dir)
        self.class_names = list(class_names)
        self.options = options
        self._coco_images: list[dict] = []
        self._coco_annotations: list[dict] = []

    def add(self, name: str, image: np.ndarray, dets: np.ndarray) -> None:
        """Write what `options` asks for about the image `name` (its path relative to the input folder)."""
        o, hw = self.options, image.shape[:2]
        dets = inside_image(dets, hw)
        if o.save_txt:
            self._write(Path("labels") / Path(name).with_suffix(".txt"), yolo_lines(dets, hw, o.save_conf))
        if o.save_voc:
            xml = voc_xml(Path(name).name, hw, dets, self.class_names)
            self._write(Path("Annotations") / Path(name).with_suffix(".xml"), [xml.rstrip("\n")])
        if o.save_coco:
            image_id = len(self._coco_images) + 1
            self._coco_images.append({"id": image_id, "file_name": name, "height": hw[0], "width": hw[1]})
            for x1, y1, x2, y2, score, cls in dets.tolist():
                self._coco_annotations.append(
                    {
                        "id": len(self._coco_annotations) + 1,
                        "image_id": image_id,
                        "category_id": int(cls) + 1,
                        "bbox": [round(v, 2) for v in (x1, y1, x2 - x1, y2 - y1)],
                        "area": round((x2 - x1) * (y2 - y1), 2),
                        "score": round(score, 5),
                        "iscrowd": 0,
                    }
                )
        if o.save_crop:
            for k, (x1, y1, x2, y2, _, cls) in enumerate(dets.tolist()):
                x1, y1 = max(int(x1), 0), max(int(y1), 0)
                x2, y2 = min(int(np.ceil(x2)), hw[1]), min(int(np.ceil(y2)), hw[0])
                if x2 <= x1 or y2 <= y1:
                    continue
                crop = (
                    self.out_dir
                    / "crops"
                    / class_name(self.class_names, int(cls))
                    / f"{Path(name).stem}_{k}.jpg"
                )
                crop.parent.mkdir(parents=True, exist_ok=True)
                cv2.imwrite(str(crop), image[y1:y2, x1:x2])

    def close(self) -> None:
        """Write predictions_coco.json (when asked for)."""
        if not self.options.save_coco:
            return
        categories = [{"id": i + 1, "name": n} for i, n in enumerate(self.class_names)]
        coco = {"images": self._coco_images, "annotations": self._coco_annotations, "categories": categories}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "predictions_coco.json").write_text(json.dumps(coco))

    def _write(self, rel: Path, lines: list[str]) -> None:
        path = self.out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))
