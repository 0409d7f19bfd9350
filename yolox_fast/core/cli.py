"""What the command-line tools share: the -f/-n/-c/-expn flags, building the exp they name, and how an
error the user can fix is reported (`run_tool`)."""

from __future__ import annotations

import argparse
import copy
import errno
import os
import sys
from collections.abc import Callable

from yolox_fast.data.build import keep_description
from yolox_fast.data.cache import CacheRoomError
from yolox_fast.exp import BaseExp, Exp, get_exp
from yolox_fast.export.common import ExportMetadata, check_input_size
from yolox_fast.utils.checkpoint import CheckpointError
from yolox_fast.utils.extras import MissingExtraError
from yolox_fast.utils.hub import WeightsDownloadError, fetch_weights, weights_key
from yolox_fast.utils.run_lock import RunLockError

# what the user can fix: missing data or files, a bad value in an exp, a description or on the command
# line, a checkpoint that cannot be used, an output folder another run holds, a runtime package not
# installed, a cache that does not fit with cache_strict; each message names the thing and what to do
USER_ERRORS = (
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
    ValueError,
    CheckpointError,
    RunLockError,
    MissingExtraError,
    WeightsDownloadError,
    CacheRoomError,
)
DEBUG_ENV = "YOLOX_FAST_DEBUG"


def run_tool(main: Callable[[], None]) -> None:
    """Run a tool's `main`. An error the user can fix (USER_ERRORS, a full disk) ends the process with
    its message on one `error:` line and exit code 1, not a traceback; any other exception is a bug of
    ours and keeps its traceback. `YOLOX_FAST_DEBUG=1` keeps the traceback for every error."""
    try:
        main()
    except (*USER_ERRORS, OSError) as err:
        user = isinstance(err, USER_ERRORS) or getattr(err, "errno", None) == errno.ENOSPC
        if not user or os.environ.get(DEBUG_ENV):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


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


def add_launch_arguments(parser: argparse.ArgumentParser, devices: int | None) -> None:
    """Add the process flags of the tools that run on several processes (train, eval), YOLOX's: -d (processes
    on this machine, default `devices`; None: every GPU, or 1 on a CPU), --dist-backend, --dist-url,
    --num_machines and --machine_rank (core/launch.py; docs/distributed.md)."""
    every_gpu = "all GPUs, or 1 on CPU; 1 per process started by torchrun, srun or a RANK/WORLD_SIZE launcher"
    parser.add_argument(
        "-d",
        "--devices",
        type=int,
        default=devices,
        help=f"processes on this machine (default: {every_gpu if devices is None else devices})",
    )
    parser.add_argument(
        "--dist-backend", type=str, default=None, help="nccl or gloo (default: nccl on CUDA, else gloo)"
    )
    parser.add_argument(
        "--dist-url",
        type=str,
        default=None,
        help="tcp://HOST:PORT of machine 0 for --num_machines > 1 (default: a free local port)",
    )
    parser.add_argument("--num_machines", type=int, default=1, help="number of machines (YOLOX style)")
    parser.add_argument("--machine_rank", type=int, default=0, help="rank of this machine (YOLOX style)")


def add_random_weights_argument(parser: argparse.ArgumentParser) -> None:
    """Add --random-weights: run the exp's model untrained when no checkpoint is found (without it, a
    missing -c is an error: a forgotten -c would otherwise draw nothing or export a useless model)."""
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="run the model with random weights when no checkpoint is given (to try a pipeline only)",
    )


def add_compile_argument(parser: argparse.ArgumentParser) -> None:
    """Add --compile: the exp field `compile` set to True (torch.compile; docs/training.md)."""
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (the exp field compile; compile_mode, compile_backend): minutes of "
        "compiling, then faster steps; compile time is reported apart",
    )


def add_inference_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the model-speed flags of eval and demo: --fuse/--no-fuse, --channels-last/--no-channels-last
    (default None: the exp's channels_last) and --compile."""
    parser.add_argument(
        "--fuse",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fold BatchNorm into the convolutions (the default: equal outputs, faster; YOLOX's flag)",
    )
    parser.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="NHWC memory format (default: the exp's channels_last, on as in training): with --fuse 1.6-2x "
        "the images/s of nano on a CPU; outputs, and with them boxes, change by fp32 rounding (~1e-3 px "
        "between batch sizes)",
    )
    add_compile_argument(parser)


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
    resolve_weights_name(args)
    return args


def resolve_weights_name(args: argparse.Namespace) -> None:
    """-c yolox-s (a zoo name, not a file here): the official weights, fetched once into the cache
    (utils/hub.py), and, without -f/-n, the zoo exp of that name (official weights store no exp)."""
    ckpt = getattr(args, "ckpt", None)
    if not ckpt or os.path.exists(ckpt) or weights_key(ckpt) is None:
        return
    args.ckpt = str(fetch_weights(ckpt))
    if not (args.exp_file or args.name):
        args.name = weights_key(ckpt)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def default_checkpoint(exp, ckpt: str | None) -> str | None:
    """`ckpt` (-c), else the exp's training output <output_dir>/<exp_name>/best_ckpt.pth if it exists, else
    None (the tool then refuses to run unless --random-weights)."""
    if ckpt is not None:
        return ckpt
    trained = os.path.join(exp.output_dir, exp.exp_name, "best_ckpt.pth")
    return trained if os.path.isfile(trained) else None


def build_exp(args: argparse.Namespace, exported: ExportMetadata | None = None, exp: BaseExp | None = None):
    """The exp of -f/-n (without them, the one the checkpoint -c stores: `exp.get_exp_by_checkpoint`) with
    the trailing `KEY VALUE` overrides (`args.opts`) and -expn applied, --tsize when the tool has it, and
    num_classes None resolved (from the dataset, else from -c).

    `exported`: the metadata of the exported file -c names. Its num_classes and input size are the model's
    and replace the exp's; -f/-n is then optional: without it the exp is the default one with the file's
    exp_name, dataset, data_dir and thresholds (test_conf, nmsthre). --tsize must be the file's input size.
    `exp`: an exp object (the Python API's) in place of -f/-n; a copy is changed, never the caller's.
    `args.dataset_description` (tools/train.py's): the dataset description its check of the command line
    read, which this exp then reuses while its data settings are the same (`data.build.dataset_config`).
    """
    if exp is not None:
        exp = copy.copy(exp)  # fields are rebound, never changed in place, by what follows
        exp.model = None  # a model the object built (an inference load fuses it in place) is not reused
    elif exported is not None and not (args.exp_file or args.name):
        exp = Exp()
        exp.exp_name, exp.dataset, exp.data_dir = exported.exp_name, exported.dataset, exported.data_dir
        exp.test_conf, exp.nmsthre = exported.test_conf, exported.nmsthre
    else:
        exp = get_exp(args.exp_file, args.name, getattr(args, "ckpt", None))
    if exported is not None:
        exp.num_classes, exp.test_size = exported.num_classes, tuple(exported.test_size)
    exp.merge(args.opts)
    # the inference flags of eval and demo (core.cli.add_inference_arguments) set their exp fields
    if getattr(args, "compile", False):
        exp.compile = True
    if getattr(args, "channels_last", None) is not None:
        exp.channels_last = args.channels_last
    if exported is not None:
        exp.compile = False  # an exp file's compile field is for its checkpoints; an exported file runs as is
    if args.experiment_name:
        exp.exp_name = args.experiment_name
    if getattr(args, "tsize", None) is not None:
        if exported is not None:
            check_input_size(exported, (args.tsize, args.tsize), args.ckpt)
        exp.test_size = (args.tsize, args.tsize)
    keep_description(exp, getattr(args, "dataset_description", None))
    exp.validate()
    if exported is None:
        exp.resolve_num_classes(getattr(args, "ckpt", None))
    elif (exp.num_classes, tuple(exp.test_size)) != (exported.num_classes, tuple(exported.test_size)):
        raise ValueError(
            f"{args.ckpt} was exported with num_classes {exported.num_classes} and input size "
            f"{tuple(exported.test_size)}: the overrides cannot change them"
        )
    return exp
