"""Loaders: the infinite training loader (with close_mosaic) and the collates that batch samples."""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Iterator, Sequence

import cv2
import numpy as np
import torch
from loguru import logger
from torch.utils.data import DataLoader, default_collate

from yolox_fast.data.sampler import YoloBatchSampler


def worker_init(worker_id: int, nice: int = 0) -> None:
    """Seed Python/NumPy from torch's per-worker seed (augmentations use explicit generators; this
    covers any library code that draws from the global ones), and add `nice` to the worker's niceness
    (`os.nice`: a lower scheduling priority; see `build.worker_nice` for why)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)
    if nice:
        try:
            os.nice(nice)
        except (AttributeError, OSError) as err:  # no os.nice (Windows), or a sandbox that refuses it
            logger.debug(f"loader worker {worker_id} keeps its priority: os.nice({nice}) failed ({err})")


def opencv_for_workers(num_workers: int) -> None:
    """Turn OpenCV's thread pool off in this (the parent) process before loader workers fork.

    A forked worker inherits the pool's bookkeeping but not its threads: touching the pool there
    (an OpenCV call, or even cv2.setNumThreads) can block forever. With the pool off before the fork
    there is nothing to inherit; the workers supply the parallelism.
    """
    if num_workers > 0:
        cv2.setNumThreads(0)


class PadCollate:
    """Training batch: (imgs (B, 3, H, W) uint8 BGR in channels-last memory, targets (B, max_labels, 5)
    float32 zero-padded, img_info list, img_ids list).

    The samples' (3, H, W) images are views of (H, W, 3) memory (TrainTransform): stacking them as
    (B, H, W, 3) copies whole pixel rows, and permuting that gives the channels-last batch the model
    trains in, with no transposing copy anywhere (a plain CHW sample is stacked just as well).
    """

    def __init__(self, max_labels: int) -> None:
        self.max_labels = max_labels

    def __call__(self, batch: Sequence[tuple[np.ndarray, np.ndarray, tuple, int]]):
        imgs = torch.from_numpy(np.stack([b[0].transpose(1, 2, 0) for b in batch])).permute(0, 3, 1, 2)
        targets = torch.zeros((len(batch), self.max_labels, 5), dtype=torch.float32)
        for i, (_, labels, _, _) in enumerate(batch):
            n = min(len(labels), self.max_labels)
            targets[i, :n] = torch.from_numpy(np.asarray(labels[:n], dtype=np.float32))
        return imgs, targets, [b[2] for b in batch], [b[3] for b in batch]


def eval_collate(batch: Sequence[tuple[np.ndarray, np.ndarray, tuple, int]]):
    """Eval batch, YOLOX layout: (imgs (B, 3, H, W) float32, targets list of (K, 5) tensors
    [x1, y1, x2, y2, cls] original px, img_info [heights (B,), widths (B,)] tensors, img_ids (B,))."""
    imgs = torch.from_numpy(np.stack([b[0] for b in batch]))
    targets = [torch.from_numpy(b[1]) for b in batch]
    info = default_collate([b[2] for b in batch])
    ids = default_collate([b[3] for b in batch])
    return imgs, targets, info, ids


class TrainLoader:
    """Infinite training batches from a MosaicDetection; len() = iterations per epoch on this rank.

    `close_mosaic()` turns mosaic/MixUp off from the very next batch: the flag travels in the batch
    sampler's items, and the worker pipeline is restarted at the number of batches consumed so far so
    that batches prefetched with mosaic on are dropped (persistent workers stay alive).
    """

    def __init__(
        self,
        dataset,
        batch_sampler: YoloBatchSampler,
        num_workers: int,
        max_labels: int,
        pin_memory: bool,
        worker_nice: int = 0,
    ) -> None:
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        opencv_for_workers(num_workers)
        self.loader = DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=num_workers > 0,
            worker_init_fn=functools.partial(worker_init, nice=worker_nice),
            collate_fn=PadCollate(max_labels),
        )
        self._iterator = None
        self._consumed = 0

    def __len__(self) -> int:
        return len(self.batch_sampler)

    @property
    def images(self):
        """The un-augmented training split the samples are drawn from (a DetectionDataset: its records,
        class names and image cache)."""
        return self.dataset.dataset

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, list, list]]:
        while True:
            if self._iterator is None:
                self.batch_sampler.start_batch = self._consumed
                self._iterator = iter(self.loader)
            batch = next(self._iterator)
            self._consumed += 1
            yield batch

    def skip_to(self, batches: int) -> None:
        """Continue the stream at batch `batches` of this rank (a resumed run: epoch * len(self) + iter).
        With the same seed, the batches are exactly those the interrupted run would have drawn next."""
        self._consumed = batches
        self._iterator = None

    def close_mosaic(self) -> None:
        """No mosaic or MixUp from the next batch on (the last no_aug_epochs)."""
        self.batch_sampler.mosaic = False
        self.dataset.enable_mosaic = False
        self._iterator = None
