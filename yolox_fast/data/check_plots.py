"""The dataset checker's pictures: labels.png (what the labels look like) and train_batch.png (what the
model sees). Drawn on matplotlib `Figure` objects, which render through the Agg backend without
pyplot's global state, so it works headless and in any process."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter

from yolox_fast.utils.visualize import class_color

SPLIT_COLORS = {"train": "tab:blue", "val": "tab:orange"}


def _rgb(cls: int) -> tuple[float, float, float]:
    b, g, r = class_color(cls)
    return r / 255, g / 255, b / 255


def plot_labels(summaries: Mapping, class_names: Sequence[str], exp, path: str | Path, title: str) -> None:
    """labels.png: boxes per class and split (bars, class names on the axis); box width x height in
    pixels at the exp's input size (2-D histogram, log colour); box centres in normalised image
    coordinates (heat map); boxes per image (histogram, exp.max_labels marked). Size and centre
    panels show the train split (val when train is unreadable)."""
    k = len(class_names)
    fig = Figure(figsize=(max(15.0, 0.3 * k), 10), layout="constrained")
    grid = fig.add_gridspec(2, 3, height_ratios=(1, 1.1))
    bars = fig.add_subplot(grid[0, :])
    width = 0.8 / max(len(summaries), 1)
    x = np.arange(k)
    for i, (split, s) in enumerate(summaries.items()):
        bars.bar(
            x + (i - (len(summaries) - 1) / 2) * width,
            s.per_class,
            width,
            label=split,
            color=SPLIT_COLORS.get(split),
        )
    bars.set_xticks(
        x,
        list(class_names),
        rotation=0 if k <= 10 else (45 if k <= 30 else 90),
        ha="right" if 10 < k <= 30 else "center",
        fontsize=10 if k <= 30 else 7,
    )
    bars.set_xlim(-0.6, k - 0.4)
    bars.set_ylabel("boxes")
    bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    bars.set_title("instances per class")
    bars.legend()

    split = "train" if "train" in summaries else next(iter(summaries))
    s = summaries[split]
    in_h, in_w = exp.input_size
    sizes_ax = fig.add_subplot(grid[1, 0])
    if len(s.sizes):
        top = max(float(s.sizes.max()), exp.box_min_size * 2, 1.0)
        bins = np.linspace(0, top, 50)
        _, _, _, image = sizes_ax.hist2d(
            s.sizes[:, 0], s.sizes[:, 1], bins=[bins, bins], norm=LogNorm(), cmap="viridis"
        )
        bar = fig.colorbar(image, ax=sizes_ax, label="boxes (log scale)")
        bar.ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        bar.ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        bar.ax.yaxis.set_minor_formatter(NullFormatter())
        sizes_ax.axvline(
            exp.box_min_size, color="red", lw=1, ls="--", label=f"box_min_size {exp.box_min_size:g} px"
        )
        sizes_ax.axhline(exp.box_min_size, color="red", lw=1, ls="--")
        sizes_ax.legend(loc="upper left", fontsize=8)
    else:
        sizes_ax.text(0.5, 0.5, "no boxes", ha="center", va="center", transform=sizes_ax.transAxes)
    sizes_ax.set_xlabel(f"box width (px at the {in_h}x{in_w} input)")
    sizes_ax.set_ylabel(f"box height (px at the {in_h}x{in_w} input)")
    sizes_ax.set_title(f"box sizes ({split})")

    centre_ax = fig.add_subplot(grid[1, 1])
    if len(s.centres):
        _, _, _, image = centre_ax.hist2d(
            s.centres[:, 0], s.centres[:, 1], bins=40, range=[[0, 1], [0, 1]], cmap="magma"
        )
        fig.colorbar(image, ax=centre_ax, label="boxes")
    centre_ax.set_xlim(0, 1)
    centre_ax.set_ylim(1, 0)  # image coordinates: y grows downwards
    centre_ax.set_aspect("equal")
    centre_ax.set_xlabel("box centre x / image width")
    centre_ax.set_ylabel("box centre y / image height")
    centre_ax.set_title(f"box centres ({split})")

    count_ax = fig.add_subplot(grid[1, 2])
    most = max((int(sm.per_image.max()) for sm in summaries.values() if len(sm.per_image)), default=0)
    step = max(1, math.ceil((most + 1) / 40))  # at most ~40 bars
    bins = np.arange(0, most + step + 1, step) - 0.5
    count_ax.hist(
        [sm.per_image for sm in summaries.values()],
        bins=bins,
        label=list(summaries),
        color=[SPLIT_COLORS.get(sp, "gray") for sp in summaries],
    )
    if exp.max_labels <= most * 1.5 + 1:
        count_ax.axvline(exp.max_labels, color="red", ls="--", label=f"max_labels {exp.max_labels}")
    count_ax.set_xlabel("boxes per image")
    count_ax.set_ylabel("images")
    count_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    count_ax.set_title(f"boxes per image (max_labels = {exp.max_labels})")
    count_ax.legend()
    fig.suptitle(title, fontsize=14)
    fig.savefig(path, dpi=100)


def plot_train_batch(
    imgs: torch.Tensor, targets: torch.Tensor, class_names: Sequence[str], exp, path: str | Path
) -> None:
    """train_batch.png: a grid of training images (B, 3, H, W) BGR 0-255 (uint8 or float) with their targets
    (B, max_labels, 5) [cls, cx, cy, w, h] px (zero rows are padding), boxes and class names drawn."""
    n = len(imgs)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(3.2 * cols, 3.2 * rows + 0.5))
    # fixed margins: a constrained layout costs more than the drawing here
    fig.subplots_adjust(
        left=0.01, right=0.99, bottom=0.01, top=1 - 0.5 / (3.2 * rows + 0.5), wspace=0.03, hspace=0.03
    )
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, img, labels in zip(axes.flat, imgs, targets):
        rgb = img.clamp(0, 255).byte().permute(1, 2, 0).numpy()[..., ::-1]
        ax.imshow(rgb)
        for cls, cx, cy, w, h in labels[(labels[:, 3] > 0) & (labels[:, 4] > 0)].tolist():
            color = _rgb(int(cls))
            ax.add_patch(
                Rectangle((cx - w / 2, cy - h / 2), w, h, fill=False, edgecolor=color, linewidth=1.2)
            )
            name = class_names[int(cls)] if int(cls) < len(class_names) else str(int(cls))
            ax.text(
                cx - w / 2,
                cy - h / 2,
                name,
                fontsize=6,
                color="black",
                va="bottom",
                bbox={"facecolor": color, "edgecolor": "none", "pad": 0.5, "alpha": 0.8},
            )
    h, w = imgs.shape[2:]
    mixup = exp.mixup_prob if exp.enable_mixup else 0.0
    fig.suptitle(
        f"{n} training samples as the model sees them: {h}x{w}, mosaic_prob {exp.mosaic_prob:g}, "
        f"mixup_prob {mixup:g}, degrees {exp.degrees:g}, flip_prob {exp.flip_prob:g}, "
        f"hsv_prob {exp.hsv_prob:g}",
        fontsize=11,
    )
    fig.savefig(path, dpi=100)
