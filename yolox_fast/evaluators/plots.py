"""Pictures of an evaluation: confusion matrix, precision-recall and F1-confidence curves.

matplotlib's object API on the Agg canvas (no pyplot, no global backend switch): every function
returns a Figure; `save_figure` renders it once, writes the PNG and returns the (H, W, 3) pixels
that also go to TensorBoard. With many classes the per-class curves are thin grey lines and only the mean
is in the legend (coloured, named lines up to `MAX_LEGEND` classes); the confusion matrix writes its
numbers into the cells up to `MAX_ANNOTATED` rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from yolox_fast.evaluators.matching import row_normalised

MAX_LEGEND = 10  # more classes than this: grey per-class curves, the mean alone in the legend
MAX_ANNOTATED = 30  # more confusion-matrix rows than this: colours only, no numbers in the cells
MEAN_COLOR = "black"


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_to_rgb(fig: Figure) -> np.ndarray:
    """The rendered figure as (H, W, 3) uint8 RGB."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save_figure(fig: Figure, path: str) -> np.ndarray:
    """Render `fig` once, write it to `path` as PNG and return the (H, W, 3) RGB pixels (for
    TensorBoard, without a second render)."""
    rgb = figure_to_rgb(fig)
    if not cv2.imwrite(path, np.ascontiguousarray(rgb[..., ::-1])):
        raise OSError(f"could not write {path}")
    return rgb


def confusion_matrix_figure(
    cm: np.ndarray, class_names: Sequence[str], normalised: bool, conf: float, iou: float
) -> Figure:
    """The (C + 1, C + 1) matrix of `matching.confusion_matrix` (rows true class, columns predicted,
    last row/column background). Colours are always the row-normalised share, so frequent and rare
    classes read alike; the cells show counts, or with `normalised` the shares."""
    names = [*class_names, "background"]
    n = len(names)
    share = row_normalised(cm)
    side = float(np.clip(0.42 * n + 3.0, 6.0, 30.0))
    fig = _figure(side + 1.2, side)
    ax = fig.add_subplot()
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0)
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, shrink=min(1.0, 8.0 / side))
    bar.set_label("share of the true-class row")
    tick_size = float(np.clip(300 / n, 7, 10))
    ax.set_xticks(range(n), names, rotation=90, fontsize=tick_size)
    ax.set_yticks(range(n), names, fontsize=tick_size)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    kind = "row-normalised" if normalised else "counts"
    ax.set_title(
        f"Confusion matrix ({kind}), conf >= {conf:g}, IoU >= {iou:g}",
        fontsize=float(np.clip(0.6 * side, 12, 20)),
    )
    if n <= MAX_ANNOTATED:
        cell_size = float(np.clip(180 / n, 5, 11))
        for i in range(n):
            for j in range(n):
                if cm[i, j] == 0:
                    continue
                text = f"{share[i, j]:.2f}" if normalised else str(int(cm[i, j]))
                color = "white" if share[i, j] > 0.5 else "black"
                ax.text(j, i, text, ha="center", va="center", fontsize=cell_size, color=color)
    return fig


def _class_curves(ax, x: np.ndarray, ys: np.ndarray, labels: Sequence[str]) -> None:
    """One line per class with data (rows of `ys` that are not all nan): coloured and labelled when
    there are at most MAX_LEGEND of them, thin grey and one legend entry otherwise."""
    shown = [c for c in range(len(ys)) if not np.isnan(ys[c]).all()]
    few = len(shown) <= MAX_LEGEND
    for rank, c in enumerate(shown):
        if few:
            ax.plot(x, ys[c], lw=1.2, color=f"C{rank % 10}", label=labels[c])
        else:
            ax.plot(x, ys[c], lw=0.6, color="0.75", label=f"{len(shown)} classes" if rank == 0 else None)


def _unit_axes(ax, xlabel: str, ylabel: str, title: str, legend_loc: str) -> None:
    """Both axes on [0, 1] (y a little above, so curves at 1 stay visible), labelled, gridded, legend."""
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend_loc, fontsize=8)


def pr_figure(
    recall_points: np.ndarray,
    precision: np.ndarray,
    class_names: Sequence[str],
    ap50: Sequence[float],
    mean_ap50: float,
) -> Figure:
    """Precision (C, R) against recall at IoU 0.5, one curve per class and their mean; the legend gives
    each class's AP50 and the mean's (the values of the per-class table)."""
    fig = _figure(7.5, 6.0)
    ax = fig.add_subplot()
    labels = [f"{n} {a:.3f}" for n, a in zip(class_names, ap50)]
    _class_curves(ax, recall_points, precision, labels)
    with_gt = ~np.isnan(precision).all(axis=1)
    if with_gt.any():
        mean = precision[with_gt].mean(axis=0)
        ax.plot(recall_points, mean, lw=3, color=MEAN_COLOR, label=f"all classes {mean_ap50:.3f} AP50")
    _unit_axes(ax, "recall", "precision", "Precision-recall curve (IoU 0.5)", "lower left")
    return fig


def f1_figure(
    confs: np.ndarray,
    f1: np.ndarray,
    class_names: Sequence[str],
    mean_f1: np.ndarray,
    best: float,
    best_conf: float,
) -> Figure:
    """F1 (C, N) against the confidence threshold, per class and the mean, the best mean marked."""
    fig = _figure(7.5, 6.0)
    ax = fig.add_subplot()
    _class_curves(ax, confs, f1, list(class_names))
    if not np.isnan(best):
        ax.plot(confs, mean_f1, lw=3, color=MEAN_COLOR, label="all classes")
        ax.axvline(best_conf, color="tab:red", ls="--", lw=1)
        ax.plot([best_conf], [best], "o", color="tab:red", ms=7)
        ax.annotate(
            f"best F1 {best:.2f} at conf {best_conf:.2f}",
            (best_conf, best),
            xytext=(8, 8),
            textcoords="offset points",
            color="tab:red",
        )
    _unit_axes(ax, "confidence threshold", "F1", "F1 against confidence (IoU 0.5)", "best")
    return fig
