"""See your data before you train: count it, list every problem in it, draw its labels and a training batch.

python tools/check_dataset.py -f exps/example/custom_coco.py
python tools/check_dataset.py -f exps/example/custom_yolo.py dataset datasets/my_yolo/data.yaml num_classes 3
python tools/check_dataset.py --dataset datasets/my_yolo/data.yaml        # a default exp with that dataset
python tools/check_dataset.py -n yolox-s --dataset datasets/voc.json --output check/ --headers-only

Reads the train and val splits (COCO, VOC or YOLO format) as training would, without training, and
prints per-split and per-class tables and every problem found, first few of each kind with a count.
Errors: a missing, empty, truncated, undecodable or oversized image, duplicate image or annotation
ids, an unknown class or category id, a malformed annotation or label line, a zero-size box, a class
count above exp.num_classes. Warnings: boxes outside their image, duplicate boxes (same class, IoU >
0.9), annotations naming no image, classes in one split only, boxes box_candidates would drop, images
with more boxes than max_labels, sizes that differ from the annotation, transparency, a missing
optional field (docs/datasets.md, "Damaged and inconsistent data"). Writes labels.png and
train_batch.png (default folder: <output_dir>/<exp_name>/dataset_check/). Exits 1 when it found
errors, 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from yolox_fast.core.cli import add_exp_arguments, build_exp
from yolox_fast.data.build import dataset_class_names, dataset_config
from yolox_fast.data.check import check_dataset
from yolox_fast.exp import Exp


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        "yolox_fast dataset check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_exp_arguments(p, ckpt_help=None)
    p.add_argument(
        "--dataset",
        type=str,
        default=None,
        help="a dataset description (.json, data.yaml or built-in name): replaces the exp's; without "
        "-f/-n a default exp checks it (num_classes from the dataset, exp_name its name)",
    )
    p.add_argument("--output", type=str, default=None, help="folder for labels.png and train_batch.png")
    p.add_argument(
        "--headers-only",
        action="store_true",
        help="open image headers only, not decode whole images (fast on huge sets; misses truncated files)",
    )
    p.add_argument("--samples", type=int, default=16, help="training samples drawn in train_batch.png")
    p.add_argument("opts", nargs=argparse.REMAINDER, help="exp overrides: KEY VALUE ...")
    return p


def build_check_exp(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The exp of -f/-n (its dataset replaced by --dataset), or a default exp for --dataset alone."""
    if args.exp_file or args.name:
        exp = build_exp(args)
        if args.dataset:
            exp.dataset = args.dataset
        return exp
    if not args.dataset:
        parser.error("give an exp (-f FILE or -n NAME) or --dataset DESCRIPTION")
    exp = Exp()
    exp.dataset = args.dataset
    exp.merge(args.opts)
    if "num_classes" not in args.opts[0::2]:
        try:
            exp.num_classes = len(dataset_class_names(exp))
        except (FileNotFoundError, ValueError):
            pass  # no readable class list: the check reports why
    exp.exp_name = args.experiment_name or dataset_config(exp)["name"]
    return exp


def main(argv=None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        exp = build_check_exp(args, parser)
        report = check_dataset(exp, args.output, decode=not args.headers_only, samples=args.samples)
    except (FileNotFoundError, ValueError) as err:  # a bad exp or description: nothing could be read
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    print(report.format())
    sys.exit(1 if report.errors else 0)


if __name__ == "__main__":
    main()
