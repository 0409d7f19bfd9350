"""Progress: a text progress bar with rate and ETA for long loops (cache building, evaluation).

It writes whole log lines through loguru, never carriage returns, so the console and `train_log.txt` read
the same: at most one line per `percent` of the work (10 % by default: eleven lines for any length), and
none closer than `every` seconds apart except the last. A redrawn bar (tqdm's '\\r') would fill a log file
with one line per update; this one costs the same in a terminal, a pipe, a SLURM log and the file sink.
"""

from __future__ import annotations

import time

from loguru import logger


class Progress:
    """`step()` once per item (or `step(n)`); logs `title [#####.....] done/total rate unit/s ETA m:ss`.

    `enabled` False (ranks other than 0) makes it silent, so that a distributed loop logs one bar.
    """

    def __init__(
        self,
        title: str,
        total: int,
        unit: str = "img",
        percent: float = 10.0,
        every: float = 5.0,
        enabled: bool = True,
        width: int = 24,
    ) -> None:
        self.title, self.total, self.unit, self.width = title, total, unit, width
        self.percent, self.every, self.enabled = percent, every, enabled
        self.done = 0
        self.start = self.last = time.time()
        self._next_mark = 0.0  # the share of the work (0-100) at or after which the next line may come

    def step(self, count: int = 1) -> None:
        self.done += count
        if not self.enabled:
            return
        now = time.time()
        share = 100.0 * self.done / max(self.total, 1)
        finished = self.done >= self.total
        if not finished and (share < self._next_mark or now - self.last < self.every):
            return
        self.last = now
        self._next_mark = (share // self.percent + 1) * self.percent
        rate = self.done / max(now - self.start, 1e-9)
        eta = max(self.total - self.done, 0) / max(rate, 1e-9)
        filled = int(self.width * min(self.done, self.total) / max(self.total, 1))
        bar = "#" * filled + "." * (self.width - filled)
        logger.info(
            f"{self.title} [{bar}] {self.done}/{self.total} {rate:.1f} {self.unit}/s "
            f"ETA {int(eta) // 60}:{int(eta) % 60:02d}"
        )
