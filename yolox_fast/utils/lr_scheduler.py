"""Learning-rate schedules as pure functions of the global iteration (so a resumed run lands on the
same curve)."""

from __future__ import annotations

import math
from collections.abc import Sequence

SCHEDULES = ("yoloxwarmcos", "warmcos", "cos", "multistep")


class LRScheduler:
    """lr(iteration) for one of SCHEDULES.

    - ``yoloxwarmcos`` (YOLOX default): quadratic warmup from ``warmup_lr_start`` to ``lr`` over
      ``warmup_epochs``, cosine from ``lr`` down to ``min_lr_ratio * lr``, then constant at that minimum
      for the last ``no_aug_epochs``.
    - ``warmcos``: linear warmup, then cosine to ``min_lr_ratio * lr`` at the last iteration.
    - ``cos``: cosine from ``lr`` to 0 over the whole run.
    - ``multistep``: ``lr * gamma ** k`` after the k-th of ``milestones`` (epochs).

    ``update_lr(iters)`` takes the number of iterations done since the start of training (0-based,
    counted over epochs, not reset per epoch) and returns the lr for the next step.
    """

    def __init__(
        self,
        name: str,
        lr: float,
        iters_per_epoch: int,
        total_epochs: int,
        warmup_epochs: float = 0,
        warmup_lr_start: float = 0.0,
        no_aug_epochs: int = 0,
        min_lr_ratio: float = 0.05,
        milestones: Sequence[int] | None = None,
        gamma: float = 0.1,
    ) -> None:
        if name not in SCHEDULES:
            raise ValueError(f"unknown lr scheduler {name!r}; choose one of {', '.join(SCHEDULES)}")
        if iters_per_epoch <= 0:
            raise ValueError(f"iters_per_epoch must be positive, got {iters_per_epoch}")
        if name == "multistep" and not milestones:
            raise ValueError("the multistep scheduler needs milestones (epochs), e.g. milestones=[200, 250]")
        self.name = name
        self.lr = lr
        self.iters_per_epoch = iters_per_epoch
        self.total_iters = iters_per_epoch * total_epochs
        self.warmup_iters = round(iters_per_epoch * warmup_epochs)
        self.warmup_lr_start = warmup_lr_start
        self.no_aug_iters = iters_per_epoch * no_aug_epochs
        self.min_lr = lr * min_lr_ratio
        self.milestones = sorted(int(m) * iters_per_epoch for m in (milestones or ()))
        self.gamma = gamma

    def update_lr(self, iters: int) -> float:
        if self.name == "yoloxwarmcos":
            return self._yolox_warm_cos(iters)
        if self.name == "warmcos":
            return self._warm_cos(iters)
        if self.name == "cos":
            return 0.5 * self.lr * (1.0 + math.cos(math.pi * min(iters, self.total_iters) / self.total_iters))
        return self.lr * self.gamma ** sum(iters >= m for m in self.milestones)

    def _yolox_warm_cos(self, iters: int) -> float:
        if self.warmup_iters > 0 and iters <= self.warmup_iters:
            frac = iters / self.warmup_iters
            return (self.lr - self.warmup_lr_start) * frac * frac + self.warmup_lr_start
        cos_end = self.total_iters - self.no_aug_iters
        if iters >= cos_end:
            return self.min_lr
        frac = (iters - self.warmup_iters) / max(1, cos_end - self.warmup_iters)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * frac))

    def _warm_cos(self, iters: int) -> float:
        if self.warmup_iters > 0 and iters <= self.warmup_iters:
            return self.warmup_lr_start + (self.lr - self.warmup_lr_start) * iters / self.warmup_iters
        frac = min(1.0, (iters - self.warmup_iters) / max(1, self.total_iters - self.warmup_iters))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * frac))
