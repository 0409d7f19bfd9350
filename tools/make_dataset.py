"""Render the built-in synthetic shapes set.

    python tools/make_dataset.py                    # the built-in shapes set ($YOLOX_DATADIR/shapes)
    python tools/make_dataset.py --format voc --out datasets/shapes_voc --num-train 200 --size 256

Writes <out>/dataset.json, a description usable as exp.dataset.
"""

import argparse

from yolox_fast.data.config import load_dataset_config
from yolox_fast.data.datasets.synthetic import default_description, generate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default="shapes", help="description whose 'synthetic' block gives the defaults"
    )
    parser.add_argument("--format", choices=("coco", "voc"), help="output format (default: the config's)")
    parser.add_argument("--out", help="output folder (default: the config's root)")
    parser.add_argument("--num-train", type=int)
    parser.add_argument("--num-val", type=int)
    parser.add_argument("--size", type=int, help="image side in px")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-objects", type=int, help="most shapes per image")
    args = parser.parse_args()

    cfg = load_dataset_config(args.config)
    fmt = args.format or cfg["format"]
    if fmt != cfg["format"] or args.out:
        description = default_description(fmt, args.out or cfg["root"], name=cfg["name"])
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
        }.items()
        if v is not None
    }
    root = generate(cfg, overrides)
    print(f"dataset description: {root / 'dataset.json'}")


if __name__ == "__main__":
    main()
