"""Detect objects with a yolox_fast ONNX export that ends in NMS, with onnxruntime, numpy and OpenCV only.

    python tools/export.py --format onnx -f exps/example/shapes_nano.py --dynamic --nms   # -> *_nms.onnx
    python examples/onnxruntime_demo.py shapes_nano_nms.onnx photo.jpg photos/ --out drawn/ --json dets.json

A self-contained file to copy into an application (no torch, no yolox_fast). The graph takes (B, 3, H, W)
float32 BGR 0-255 images letterboxed to its input size and returns "detections" (B, D, 6) [x1, y1, x2, y2,
score, class] in input pixels, best first, and "num_detections" (B,); see docs/deployment.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort

PAD_VALUE = 114  # the grey the letterbox fills with, as in training
IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


def letterbox(image: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, float]:
    """(1, 3, H, W) float32 input and r: `image` (h, w, 3) BGR scaled by r = min(H / h, W / w) with bilinear
    resizing, pasted at the top-left corner of an (H, W) canvas of PAD_VALUE. A box in the input maps back
    to the image by / r (no offset to remove: the image starts at the corner)."""
    r = min(size[0] / image.shape[0], size[1] / image.shape[1])
    h, w = int(image.shape[0] * r), int(image.shape[1] * r)
    canvas = np.full((size[0], size[1], 3), PAD_VALUE, dtype=np.uint8)
    same_size = (h, w) == image.shape[:2]
    canvas[:h, :w] = image if same_size else cv2.resize(image, (w, h), interpolation=cv2.INTER_LINEAR)
    return canvas.transpose(2, 0, 1)[None].astype(np.float32), r


def detect(session: ort.InferenceSession, image: np.ndarray, conf: float) -> np.ndarray:
    """(K, 6) [x1, y1, x2, y2, score, class] in `image`'s pixels, score >= conf, best first."""
    graph_input = session.get_inputs()[0]
    size = tuple(graph_input.shape[2:4])  # (H, W), fixed at export
    batch, r = letterbox(image, size)
    detections, counts = session.run(None, {graph_input.name: batch})  # (1, D, 6), (1,)
    dets = detections[0, : int(counts[0])].astype(np.float64)
    dets[:, :4] /= r
    return dets[dets[:, 4] >= conf]


def class_names(session: ort.InferenceSession) -> list[str]:
    """The class names the export wrote into the file's metadata (numbers if it has none)."""
    meta = session.get_modelmeta().custom_metadata_map.get("yolox_fast")
    return list(json.loads(meta)["class_names"]) if meta else []


def draw(image: np.ndarray, dets: np.ndarray, names: list[str]) -> np.ndarray:
    out = image.copy()
    for x1, y1, x2, y2, score, cls in dets:
        name = names[int(cls)] if int(cls) < len(names) else str(int(cls))
        cv2.rectangle(out, (int(x1), int(y1)), (int(x2), int(y2)), (0, 200, 0), 2)
        cv2.putText(out, f"{name} {score:.2f}", (int(x1), max(int(y1) - 3, 10)), 0, 0.4, (0, 200, 0), 1)
    return out


def list_images(paths: list[str]) -> list[tuple[Path, Path]]:
    """(image, its name relative to the folder given, or its file name) for files and folders (recursive)."""
    found = []
    for given in map(Path, paths):
        files = [given] if given.is_file() else sorted(given.rglob("*"))
        base = given.parent if given.is_file() else given
        found += [(f, f.relative_to(base)) for f in files if f.suffix.lower() in IMAGE_EXTS]
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="an .onnx file exported with --nms")
    p.add_argument("images", nargs="+", help="image files or folders")
    p.add_argument("--conf", type=float, default=0.3, help="score threshold (default 0.3)")
    p.add_argument("--out", default=None, help="folder for the images with their boxes drawn")
    p.add_argument("--json", default=None, help="file for the detections, per image name")
    args = p.parse_args()

    session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    names = class_names(session)
    records = {}
    for path, name in list_images(args.images):
        image = cv2.imread(str(path))
        if image is None:
            print(f"{path}: not an image OpenCV can read, skipped")
            continue
        dets = detect(session, image, args.conf)
        print(f"{name}: {len(dets)} detections")
        records[str(name)] = [
            {"bbox": [round(float(v), 2) for v in box], "score": round(float(score), 5), "class_id": int(cls)}
            for *box, score, cls in dets
        ]
        if args.out:
            target = Path(args.out) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(target), draw(image, dets, names))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
