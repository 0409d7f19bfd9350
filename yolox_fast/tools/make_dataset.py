"""Render the built-in synthetic shapes set.

    python tools/make_dataset.py                    # the built-in shapes set ($YOLOX_DATADIR/shapes)
    python tools/make_dataset.py --format voc --out datasets/shapes_voc --num-train 200 --size 256
    python tools/make_dataset.py --format yolo                 # Ultralytics layout in datasets/shapes_yolo

Writes <out>/dataset.json (YOLO: <out>/data.yaml), a description usable as exp.dataset.
"""

import argparse
import shutil
from pathlib import Path

from yolox_fast.core.cli import run_tool
from yolox_fast.data.datasets.coco import COCODataset
from yolox_fast.data.datasets.synthetic import default_description, generate
from yolox_fast.data.datasets.yolo import write_yolo_dataset
from yolox_fast.data.description import read_description


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default="shapes", help="description whose 'synthetic' block gives the defaults"
    )
    parser.add_argument(
        "--format", choices=("coco", "voc", "yolo"), help="output format (default: the config's)"
    )
    parser.add_argument("--out", help="output folder (default: the config's root; YOLO: <root>_yolo)")
    parser.add_argument("--num-train", type=int)
    parser.add_argument("--num-val", type=int)
    parser.add_argument("--size", type=int, help="image side in px")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-objects", type=int, help="most shapes per image")
    parser.add_argument("--min-side", type=float, help="smallest shape extent in px")
    args = parser.parse_args(argv)

    cfg = read_description(args.config)
    fmt, out, yolo_out = args.format or cfg["format"], args.out, None
    if fmt == "yolo":  # rendered in COCO format beside the output, then converted
        yolo_out = Path(out or f"{cfg['root']}_yolo")
        fmt, out = "coco", str(yolo_out.parent / f"{yolo_out.name}.coco-source")
    if fmt != cfg["format"] or out:
        description = default_description(fmt, out or cfg["root"], name=cfg["name"])
        description["synthetic"] = cfg.get("synthetic", {})
        cfg = description
    overrides = {
        k: v
        for k, v in {
            "num_train": args.num_train,
            "num_val": args.num_val,
            "size": args.size,
            "seed": args.seed,
            "max_objects": args.max_objects,
            "min_side": args.min_side,
        }.items()
        if v is not None
    }
    root = generate(cfg, overrides)
    if yolo_out is not None:
        splits = {s: COCODataset(str(root), cfg[s]["images"], cfg[s]["ann"]) for s in ("train", "val")}
        data_yaml = write_yolo_dataset(yolo_out, splits)
        shutil.rmtree(root)
        print(f"dataset description: {data_yaml}")
        return
    print(f"dataset description: {root / 'dataset.json'}")


if __name__ == "__main__":
    run_tool(main)
