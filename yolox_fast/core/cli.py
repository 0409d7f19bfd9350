"""What the command-line tools share: the -f/-n/-c/-expn flags and building the exp they name."""

from __future__ import annotations

import argparse

from yolox_fast.exp import get_exp


def add_exp_arguments(parser: argparse.ArgumentParser, ckpt_help: str | None) -> None:
    """Add YOLOX's -expn, -n, -f and -c flags to `parser` (no -c when `ckpt_help` is None)."""
    parser.add_argument(
        "-expn",
        "--experiment-name",
        type=str,
        default=None,
        help="output sub-folder name (default: the exp's exp_name)",
    )
    parser.add_argument("-n", "--name", type=str, default=None, help="model-zoo name, e.g. yolox-s")
    parser.add_argument("-f", "--exp_file", type=str, default=None, help="experiment file")
    if ckpt_help is not None:
        parser.add_argument("-c", "--ckpt", type=str, default=None, help=ckpt_help)
    parser.epilog = (
        "Other words on the line are KEY VALUE pairs that override exp fields, e.g. "
        "max_epoch 100 input_size '(512, 512)' (python -c 'from yolox_fast.exp import Exp; print(Exp())' "
        "lists every field)."
    )


def parse_with_overrides(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse flags anywhere on the line; what is left are the exp's `KEY VALUE` overrides (`args.opts`).

    A REMAINDER positional (YOLOX's way) would swallow every flag after the first override
    (`max_epoch 10 -b 8` makes "-b" a key); here such a line works, and a leftover that looks like a
    flag is reported as an unknown flag rather than an unknown exp key.
    """
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if a.startswith("-") and not _is_number(a)]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.opts = rest
    return args


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def build_exp(args: argparse.Namespace):
    """The exp of -f/-n with the trailing `KEY VALUE` overrides (`args.opts`) and -expn applied, --tsize
    when the tool has it, and num_classes None resolved (from the dataset, else from -c)."""
    exp = get_exp(args.exp_file, args.name)
    exp.merge(args.opts)
    if args.experiment_name:
        exp.exp_name = args.experiment_name
    if getattr(args, "tsize", None) is not None:
        exp.test_size = (args.tsize, args.tsize)
    exp.validate()
    exp.resolve_num_classes(getattr(args, "ckpt", None))
    return exp
