"""DamagedImages: which images of a split failed to decode, shared by the process that read the split and
its loader workers, and the rule that stops training when too many have.

Damage is found where an image is read (`image_io.read_image`), mostly inside loader workers. Each
worker marks the image in one flag array in shared memory (made before the workers fork), so the training
process sees every worker's finds: it counts them in the epoch summary and stops with one line when more
than `exp.max_corrupt_fraction` of the split is damaged, instead of a worker raising a traceback.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from loguru import logger


class TooManyDamagedImages(ValueError):
    """More of the training split is damaged than exp.max_corrupt_fraction allows (a user error: the
    message names the files and what to do)."""


class DamagedImages:
    """Flags (N,) of the images of a split found damaged, in shared memory; `file_of(i)` names image i
    (read from the dataset's index when a message needs it: no per-image list is held)."""

    def __init__(self, file_of: Callable[[int], str], total: int, split: str) -> None:
        self.file_of = file_of
        self.total = total
        self.split = split
        self.flags = torch.zeros(total, dtype=torch.uint8).share_memory_()  # (N,) 1 = damaged
        self._view = None

    def __contains__(self, index: int) -> bool:
        # through a numpy view of the shared flags, made once per process: indexing the tensor, or even
        # taking the view, costs more than the rest of a sample's bookkeeping
        if self._view is None:
            self._view = self.flags.numpy()
        return bool(self._view[index])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_view": None}  # the tensor pickles as shared memory, a view as a copy

    def mark(self, index: int, reason: str) -> None:
        """Record image `index` as damaged; the first process to find it says so in one warning."""
        if self.flags[index]:
            return
        self.flags[index] = 1
        logger.warning(f"{reason}: skipped ({self.count()} of {self.total} images of {self.split} so far)")

    def count(self) -> int:
        return int(self.flags.sum())

    def first(self, k: int = 3) -> list[str]:
        """The files of the first `k` damaged images (by position in the split)."""
        return [self.file_of(i) for i in torch.nonzero(self.flags)[:k, 0].tolist()]

    def summary(self) -> str:
        """'N damaged images skipped (first: ...)', or '' when none was found."""
        n = self.count()
        return f"{n} damaged images skipped (first: {', '.join(self.first())})" if n else ""

    def check(self, max_fraction: float | None) -> None:
        """Raise TooManyDamagedImages when more than `max_fraction` of the split (None: no limit) or the
        whole split is damaged."""
        n, total = self.count(), self.total
        if n == total:
            raise TooManyDamagedImages(
                f"{self.split}: none of its {total} images can be decoded (first: {', '.join(self.first())})"
            )
        if max_fraction is None or n <= max_fraction * total:
            return
        raise TooManyDamagedImages(
            f"{self.split}: {n} of its {total} images are damaged, more than max_corrupt_fraction "
            f"{max_fraction:g} allows (first: {', '.join(self.first())}); replace or remove them "
            "(python tools/check_dataset.py lists them all), or raise max_corrupt_fraction"
        )
