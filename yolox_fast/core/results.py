"""One table and one picture of a run: `results.csv` and `results.png` in the output folder, rewritten after
every epoch (Ultralytics users open these two files rather than start TensorBoard).

results.csv, one row per epoch:

    epoch       1-based
    total_loss, iou_loss, l1_loss, conf_loss, cls_loss
                each the mean over the epoch's applied optimizer steps (a skipped non-finite step is
                not counted; after a mid-epoch resume, the mean of the steps run since)
    lr          the lr of the epoch's last step
    AP50_95, AP50
                the epoch's evaluation (EMA weights); empty when the epoch was not evaluated
    time_s      wall time of the epoch in seconds: its steps, its checkpoints and its evaluation

results.png: the five losses, the lr and both APs against the epoch, one panel each.

A resumed run keeps the rows of the epochs its checkpoint had finished and writes the later ones anew, so
an epoch trained again after a `kill -9` (resumed from the epoch before) replaces its row, never repeats it.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

LOSSES = ("total_loss", "iou_loss", "l1_loss", "conf_loss", "cls_loss")
COLUMNS = ("epoch", *LOSSES, "lr", "AP50_95", "AP50", "time_s")
CSV_NAME, PNG_NAME = "results.csv", "results.png"


class EpochResults:
    """The rows of one run: `add_step(losses)` after each applied optimizer step, `end_epoch(...)` after each
    epoch (which rewrites both files). `enabled` False (ranks other than 0) keeps nothing and writes nothing.

    `done_epochs`: epochs the starting checkpoint had finished (0 for a fresh run): their rows are kept from
    an existing results.csv, any later row is dropped.
    """

    def __init__(self, run_dir: str, done_epochs: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self.csv_path = os.path.join(run_dir, CSV_NAME)
        self.png_path = os.path.join(run_dir, PNG_NAME)
        self.rows: list[dict[str, float | None]] = []
        if enabled and done_epochs > 0:
            self.rows = [r for r in read_results(self.csv_path) if r["epoch"] <= done_epochs]
        self._sums: dict[str, float] = {}
        self._steps = 0

    def add_step(self, losses: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        for key in LOSSES:
            if key in losses:
                self._sums[key] = self._sums.get(key, 0.0) + float(losses[key])
        self._steps += 1

    def end_epoch(self, epoch: int, lr: float, ap: tuple[float, float] | None, seconds: float) -> None:
        """Record 1-based `epoch` (its lr at the last step, `ap` = (AP50:95, AP50) or None when it was not
        evaluated) and rewrite results.csv and results.png."""
        if not self.enabled:
            return
        row: dict[str, float | None] = {"epoch": epoch}
        row.update(
            {k: self._sums[k] / self._steps if self._steps and k in self._sums else None for k in LOSSES}
        )
        row.update({"lr": lr, "AP50_95": ap[0] if ap else None, "AP50": ap[1] if ap else None})
        row["time_s"] = seconds
        self.rows = [r for r in self.rows if r["epoch"] < epoch] + [row]
        self._sums, self._steps = {}, 0
        write_csv(self.rows, self.csv_path)
        write_plot(self.rows, self.png_path)


def read_results(path: str) -> list[dict[str, float | None]]:
    """The rows of a results.csv (numbers; None where empty); [] when there is no such file."""
    if not os.path.isfile(path):
        return []
    with open(path, newline="") as f:
        rows = [
            {k: float(v) if v not in ("", None) else None for k, v in r.items()} for r in csv.DictReader(f)
        ]
    for r in rows:
        r["epoch"] = int(r["epoch"])
    return rows


def write_csv(rows: list[Mapping[str, float | None]], path: str) -> None:
    """Write `rows` atomically (a reader never sees half a file)."""
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if r.get(k) is None else _cell(k, r[k]) for k in COLUMNS})
    os.replace(tmp, path)


def _cell(key: str, value: float) -> str:
    if key == "epoch":
        return str(int(value))
    return f"{value:.6g}" if key != "time_s" else f"{value:.1f}"


def write_plot(rows: list[Mapping[str, float | None]], path: str) -> None:
    """results.png: one panel per loss, the lr and each AP, against the epoch (matplotlib on the Agg canvas,
    no display needed)."""
    from yolox_fast.evaluators.plots import save_figure

    fig = Figure(figsize=(14, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 4).ravel()
    for ax, key in zip(axes, (*LOSSES, "lr", "AP50_95", "AP50")):
        points = [(r["epoch"], r[key]) for r in rows if r.get(key) is not None and math.isfinite(r[key])]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, color="tab:blue")
        ax.set_title(key.replace("AP50_95", "AP50:95"))
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    save_figure(fig, path)
