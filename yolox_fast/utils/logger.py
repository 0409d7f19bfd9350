"""loguru set-up for training: console on rank 0, a log file, and Python warnings routed into the log."""

from __future__ import annotations

import os
import sys
import warnings

from loguru import logger

CONSOLE_FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss}</green> | <level>{level: <8}</level> | "
    "<cyan>{name}</cyan>:<cyan>{line}</cyan> - <level>{message}</level>"
)
FILE_FORMAT = "{time:YYYY-MM-DD HH:mm:ss} | {level: <8} | {name}:{line} - {message}"


def setup_logger(
    save_dir: str, distributed_rank: int = 0, filename: str = "train_log.txt", mode: str = "a"
) -> None:
    """Log to stderr and ``save_dir/filename`` on rank 0; other ranks log warnings and errors only.

    ``mode="a"`` appends, so a resumed or restarted run keeps one continuous log. Warnings raised
    through the ``warnings`` module go to the same sinks instead of bare stderr lines.
    """
    logger.remove()
    if distributed_rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        logger.add(sys.stderr, format=CONSOLE_FORMAT, level="INFO", colorize=sys.stderr.isatty())
        path = os.path.join(save_dir, filename)
        if mode == "w" and os.path.exists(path):
            os.remove(path)
        logger.add(path, format=FILE_FORMAT, level="INFO", enqueue=False)
    else:
        # other ranks stay quiet unless something is wrong, and say which rank it was
        logger.add(sys.stderr, format=f"[rank {distributed_rank}] " + CONSOLE_FORMAT, level="WARNING")
    warnings.showwarning = _warning_to_logger


def _warning_to_logger(message, category, filename, lineno, file=None, line=None) -> None:
    logger.opt(depth=2).warning(f"{category.__name__}: {message} ({os.path.basename(filename)}:{lineno})")
