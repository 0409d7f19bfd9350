"""Differences from official YOLOX 0.3.0 that docs/fidelity.md lists, each measured on both sides with each
side's own code: iterations per epoch, the un-augmented fallback of TrainTransform, and which setting fixes
the multi-scale sizes.

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/differences.py
"""

from __future__ import annotations

import contextlib
import random

import common
import numpy as np
import torch

# (training images, batch): not multiples, a multiple, fewer than two batches
EPOCH_CASES = ((10, 4), (24, 5), (24, 8), (7, 4))


def iterations_per_epoch() -> dict:
    """The iterations of one epoch: official's trainer runs len(train_loader) (its batch sampler keeps the
    last, short batch: ceil), ours runs `steps_per_epoch(len(train_loader))` (whole batches: floor)."""
    from yolox.data import DataLoader as OfficialLoader
    from yolox.data import InfiniteSampler as OfficialSampler
    from yolox.data import YoloBatchSampler as OfficialBatchSampler

    from yolox_fast.core.accumulation import steps_per_epoch
    from yolox_fast.data.loader import TrainLoader
    from yolox_fast.data.sampler import InfiniteSampler, YoloBatchSampler

    rows = []
    for images, batch in EPOCH_CASES:
        official = OfficialLoader(
            list(range(images)),
            batch_sampler=OfficialBatchSampler(OfficialSampler(images, seed=0), batch, drop_last=False),
            num_workers=0,
        )
        ours = TrainLoader(
            list(range(images)),
            YoloBatchSampler(InfiniteSampler(images, seed=0, rank=0, world_size=1), batch, mosaic=True),
            num_workers=0,
            max_labels=1,
            pin_memory=False,
        )
        rows.append(
            {
                "images": images,
                "batch": batch,
                "official": len(official),
                "ours": steps_per_epoch(len(ours), 1, batch),
            }
        )
    return {"cases": rows}


def unaugmented_fallback() -> dict:
    """TrainTransform on an image whose every box ends up at most 1 px on a side (mirror on, HSV off):
    official falls back to the un-augmented (unmirrored) image with all its boxes; ours keeps the
    augmented image and drops the boxes."""
    from yolox.data.data_augment import TrainTransform as OfficialTransform
    from yolox.data.data_augment import preproc

    from yolox_fast.data.augment import TrainTransform
    from yolox_fast.data.datasets.synthetic import render_image

    img = np.ascontiguousarray(render_image(np.random.default_rng(0), 256)[0][:, :200])  # (256, 200, 3)
    labels = np.array([[30, 30, 30.6, 90, 3], [100, 10, 160, 10.5, 1]], dtype=np.float64)  # 0.6 and 0.5 px
    random.seed(0)
    off_img, off_labels = OfficialTransform(max_labels=120, flip_prob=1.0, hsv_prob=0.0)(
        img.copy(), labels.copy(), (320, 320)
    )
    ours_img, ours_labels = TrainTransform(max_labels=120, flip_prob=1.0, hsv_prob=0.0)(
        img.copy(), labels.copy(), (320, 320), np.random.default_rng(0)
    )
    plain, _ = preproc(img, (320, 320))  # letterboxed, not mirrored
    mirrored, _ = preproc(np.ascontiguousarray(img[:, ::-1]), (320, 320))
    off_labels = off_labels[off_labels.sum(1) > 0]
    return {
        "boxes_in": len(labels),
        "official_boxes": len(off_labels),
        "official_is_unaugmented": bool(np.array_equal(off_img, plain)),
        "official_box_classes": off_labels[:, 0].tolist(),
        "ours_boxes": len(ours_labels),
        "ours_is_mirrored": bool(np.array_equal(np.asarray(ours_img, dtype=np.float32), mirrored)),
    }


@contextlib.contextmanager
def cuda_as_cpu():
    """Official's random_resize puts its two-number tensor on CUDA: keep it on the CPU for this run."""
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda


def multiscale_sizes(draws: int = 300) -> dict:
    """The sizes each side's random_resize draws (same seed) for exps that set random_size (nano, tiny)
    and one that does not (s), each with multiscale_range 0 and as shipped."""
    from yolox.exp import get_exp as official_get_exp

    from yolox_fast.exp import get_exp

    rows = {}
    for name in ("yolox-nano", "yolox-tiny", "yolox-s"):
        for multiscale_range in (None, 0):
            sides = {}
            for side, exp in (("official", official_get_exp(None, name)), ("ours", get_exp(exp_name=name))):
                if multiscale_range is not None:
                    exp.multiscale_range = multiscale_range
                random.seed(0)
                with cuda_as_cpu():
                    sides[side] = [tuple(exp.random_resize(None, 0, 0, False)) for _ in range(draws)]
            rows[f"{name}, multiscale_range {'as shipped' if multiscale_range is None else 0}"] = {
                "same_draws": sides["official"] == sides["ours"],
                "sizes": sorted({h for h, _ in sides["ours"]}),
                "official_sizes": sorted({h for h, _ in sides["official"]}),
            }
    return rows


def collect(argv: list[str] | None = None) -> dict:
    return {
        "iterations_per_epoch": iterations_per_epoch(),
        "unaugmented_fallback": unaugmented_fallback(),
        "multiscale": multiscale_sizes(),
    }


if __name__ == "__main__":
    common.run(collect)
