"""Train a YOLOX model: `python tools/train.py -f exps/example/shapes_nano.py` (YOLOX's flags).

One machine, K processes: `-d K` (or `torchrun --nproc_per_node K tools/train.py ...`); many machines:
torchrun, srun, a RANK/WORLD_SIZE launcher (Kubeflow), or YOLOX's --num_machines/--machine_rank/--dist-url.
See docs/distributed.md.
"""

import argparse

from loguru import logger

from yolox_fast.core import trackers
from yolox_fast.core.cli import (
    add_compile_argument,
    add_exp_arguments,
    add_launch_arguments,
    build_exp,
    parse_with_overrides,
    run_tool,
)
from yolox_fast.core.launch import launch
from yolox_fast.core.trainer import run_training
from yolox_fast.data.build import kept_description


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("YOLOX train")
    add_exp_arguments(parser, "checkpoint: resumed with --resume, otherwise its weights start a fine-tuning")
    parser.add_argument(
        "-b",
        "--batch-size",
        type=int,
        default=None,
        help="total batch size over all processes (default: the exp's batch_size, 64 in YOLOX recipes)",
    )
    add_launch_arguments(parser, devices=None)
    parser.add_argument("--resume", action="store_true", help="continue from latest_ckpt.pth (or -c)")
    parser.add_argument(
        "--auto-resume",
        action="store_true",
        help="continue from latest_ckpt.pth if it exists, so that a re-run (requeued job, restarted pod) "
        "continues (always on after a torchrun restart or SLURM requeue)",
    )
    parser.add_argument(
        "--force-lock",
        action="store_true",
        help="take over the output folder's .lock left by a run on another host (check that it is gone)",
    )
    parser.add_argument("-e", "--start_epoch", type=int, default=None, help="epoch to resume at (1-based)")
    add_compile_argument(parser)
    amp = parser.add_mutually_exclusive_group()
    amp.add_argument(
        "--fp16",
        action="store_true",
        help="fp16 autocast + loss scaling (bf16 on CPU, unless the exp override cpu_amp_dtype fp16)",
    )
    amp.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument(
        "--cache",
        type=str,
        nargs="?",
        const="ram",
        default=None,
        choices=["ram", "disk"],
        help="cache letterboxed images: ram (shared memory; the default of a bare --cache) or disk",
    )
    parser.add_argument(
        "-o",
        "--occupy",
        action="store_true",
        help="accepted for YOLOX compatibility; PyTorch's caching allocator makes it unnecessary",
    )
    parser.add_argument(
        "-l",
        "--logger",
        type=trackers.parse_logger,
        default="tensorboard",
        help="where metrics, pictures and checkpoints go besides the output folder: tensorboard (default), "
        "wandb, mlflow, several joined by commas (tensorboard,mlflow) or none; W&B and MLflow options are "
        "trailing words: wandb-project NAME, mlflow-experiment_name NAME, ... (docs/training.md)",
    )
    return parser


def parse_args(argv=None, exp=None) -> argparse.Namespace:
    """Parsed flags with the exp-dependent defaults (batch size, experiment name) filled in; `exp`: an exp
    object in place of -f/-n (the Python API's)."""
    args = parse_with_overrides(make_parser(), argv)
    # YOLOX's wandb-KEY / mlflow-KEY words are the trackers' options, not exp overrides
    args.opts, args.tracker_options = trackers.split_options(args.opts)
    trackers.check(args.logger, args.tracker_options)  # a missing package is an error now, not hours later
    exp = build_exp(args, exp=exp)  # fail here, once, on a bad -f/-n or override rather than in every worker
    if args.batch_size is None:
        args.batch_size = exp.batch_size
    if args.experiment_name is None:
        args.experiment_name = exp.exp_name
    args.dataset_description = kept_description(exp)  # read by num_classes None: the run's exp reuses it
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.occupy:
        logger.info("-o/--occupy has no effect here: PyTorch's caching allocator keeps memory once used")
    launch(
        run_training,
        args.devices,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        backend=args.dist_backend,
        dist_url=args.dist_url,
        args=(args,),
    )


if __name__ == "__main__":
    run_tool(main)
