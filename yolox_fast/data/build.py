"""Builders the Exp calls: datasets and loaders for training and evaluation from a dataset description."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
from loguru import logger
from torch.utils.data import DataLoader

from yolox_fast.data.augment import TrainTransform
from yolox_fast.data.cache import build_cache
from yolox_fast.data.datasets.base import DetectionDataset
from yolox_fast.data.datasets.coco import COCODataset, coco_category_names
from yolox_fast.data.datasets.synthetic import ensure_generated
from yolox_fast.data.datasets.voc import VOCDetection, log_ratio_split
from yolox_fast.data.datasets.yolo import YOLODataset
from yolox_fast.data.description import data_class_names, read_description
from yolox_fast.data.loader import TrainLoader, eval_collate, opencv_for_workers, worker_init
from yolox_fast.data.mosaic import MosaicDetection
from yolox_fast.data.paths import CONFIG_DIR, datasets_root, resolve_root
from yolox_fast.data.sampler import InfiniteSampler, ShardSampler, YoloBatchSampler
from yolox_fast.utils import dist as dist_utils


def dataset_config(exp) -> dict[str, Any]:
    """exp.dataset's description with the exp's YOLOX-style overrides applied.

    `exp.data_dir` replaces the root: "my data, in this description's layout". The class names then
    come from that set's own data (COCO categories sorted by id, VOC object names), never from the
    description's list, unless `exp.class_names` names them. `exp.train_ann` / `exp.val_ann`, when set
    (not None), replace the description's annotation files. Reads no images and generates nothing (see
    `prepare_dataset`).

    Read once for the settings it depends on: the exp keeps it (`_dataset_description`, with those
    settings), so the builders of one run (splits, evaluator, class names, checks) share one read, and
    an exp whose settings changed since (a copy given another data_dir, say) reads it again. Each call
    returns its own copy, free to change.
    """
    settings = _description_settings(exp)
    kept = getattr(exp, "_dataset_description", None)
    if kept is None or kept[0] != settings:
        kept = (settings, _read_exp_description(exp))
        exp._dataset_description = kept  # rebound, never changed in place: copies of the exp may share it
    return copy.deepcopy(kept[1])


def kept_description(exp) -> tuple | None:
    """The description `dataset_config` keeps on exp with the settings it was read for (None before the
    first read): plain data, for another exp of the same run (`keep_description`), in another process
    too."""
    return getattr(exp, "_dataset_description", None)


def keep_description(exp, kept: tuple | None) -> None:
    """Give exp the description another exp of the same run read (`kept_description`), so exp reads none
    while its settings are those it was read for. None: nothing was read."""
    if kept is not None:
        exp._dataset_description = kept


def _description_settings(exp) -> tuple:
    """What `dataset_config` reads depends on: the exp's data fields, $YOLOX_DATADIR and the working
    directory (relative roots)."""
    names = tuple(exp.class_names) if exp.class_names else None
    anns = (getattr(exp, "train_ann", None), getattr(exp, "val_ann", None))
    return (exp.dataset, exp.data_dir, *anns, names, str(datasets_root()), os.getcwd())


def _read_exp_description(exp) -> dict[str, Any]:
    cfg = read_description(exp.dataset, class_names=not exp.data_dir)
    if exp.data_dir:
        cfg["root"] = resolve_root(exp.data_dir)
        cfg["name"] = Path(cfg["root"]).name or cfg["name"]
        cfg.pop("synthetic", None)  # the user's data is not the built-in generated set
    if cfg["format"] == "coco":
        for split, field in (("train", "train_ann"), ("val", "val_ann")):
            value = getattr(exp, field, None)
            if value:
                cfg[split] = {**cfg[split], "ann": value}
        if exp.data_dir and not exp.class_names:
            cfg["class_names"] = None  # filled from the categories when the dataset is read
    if exp.class_names:
        cfg["class_names"] = list(exp.class_names)
    elif exp.data_dir and cfg["format"] == "voc":
        cfg["class_names"] = data_class_names(cfg)
    return cfg


def prepare_dataset(exp) -> dict[str, Any]:
    """exp's dataset description, after generating the built-in synthetic set if the description asks
    for one that is missing (safe with many processes: one generates, the others wait)."""
    cfg = dataset_config(exp)
    if "synthetic" in cfg:
        ensure_generated(cfg)
    return cfg


def dataset_class_names(exp) -> tuple[str, ...]:
    """The class names of exp's dataset, read from the COCO categories when the description has none."""
    cfg = dataset_config(exp)
    return tuple(cfg["class_names"] or coco_category_names(cfg))


def _dataset(exp, cfg: dict[str, Any], split: str, img_size, problems=None) -> DetectionDataset:
    try:
        return _read_split(exp, cfg, split, img_size, problems)
    except FileNotFoundError as err:
        if Path(cfg.get("config_path", "")).parent != CONFIG_DIR or "synthetic" in cfg:
            raise
        raise FileNotFoundError(f"{err}. {missing_builtin_hint(cfg)}") from None


def missing_builtin_hint(cfg: dict[str, Any]) -> str:
    """What to do when a built-in description's data is not there: where it goes, and the no-download
    quick start."""
    where = "$YOLOX_DATADIR" if os.environ.get("YOLOX_DATADIR") else "./datasets ($YOLOX_DATADIR is not set)"
    name = cfg["name"]
    return (
        f"The built-in `{name}` description reads {cfg['root']}: put the {name.upper()} set there (under "
        f"{where}; docs/datasets.md shows the layout) or set YOLOX_DATADIR to the folder that holds it. "
        "No data to hand? python tools/train.py -f exps/example/shapes_nano.py trains on a generated set"
    )


def _read_split(exp, cfg: dict[str, Any], split: str, img_size, problems=None) -> DetectionDataset:
    names = cfg.get("class_names")
    common = {
        "img_size": tuple(img_size),
        "name": f"{cfg['name']}-{split}",
        "skip_corrupt": exp.skip_corrupt_images,
        "for_eval": split == "val",
        "problems": problems,
    }
    if cfg["format"] == "coco":
        return COCODataset(
            cfg["root"],
            cfg[split]["images"],
            cfg[split]["ann"],
            class_names=names,
            index_dir=exp.cache_dir,
            **common,
        )
    if cfg["format"] == "yolo":
        return YOLODataset(
            cfg["root"], cfg[split]["images"], names, keypoints=bool(cfg.get("keypoints")), **common
        )
    return VOCDetection(cfg["root"], cfg[split], names, **common)


def build_checked_dataset(exp, split: str, problems) -> DetectionDataset:
    """`split` ("train" or "val") of exp's dataset at exp.input_size, read into the DatasetProblems log
    `problems`: with a collecting log every bad annotation is recorded and left out (the checker)."""
    return _dataset(exp, dataset_config(exp), split, exp.input_size, problems=problems)


def _cache_mode(cache: None | bool | str) -> str | None:
    if cache is None or cache is False:
        return None
    if cache is True:
        return "ram"
    if cache not in ("ram", "disk"):
        raise ValueError(f"cache must be None, True, 'ram' or 'disk', got {cache!r}")
    return cache


def build_train_dataset(exp, cache: None | bool | str = None) -> DetectionDataset:
    """The training split, un-augmented, images resized to fit exp.input_size; with `cache` ("ram",
    "disk" or True = "ram") served from an ImageCache. `exp.cache_strict` (if set) turns "not
    enough room for the cache" into an error; `exp.cache_dir` (if set) places the disk cache."""
    cfg = dataset_config(exp)
    if cfg["format"] == "voc" and "val_ratio" in cfg["train"]:
        log_ratio_split(cfg["name"], cfg["root"], cfg["train"])
    dataset = _dataset(exp, cfg, "train", exp.input_size)
    if dataset.num_classes > exp.num_classes:
        raise ValueError(
            f"dataset {cfg['name']} has {dataset.num_classes} classes but "
            f"exp.num_classes = {exp.num_classes}; "
            f"set num_classes = {dataset.num_classes} in the exp"
        )
    if dataset.num_classes < exp.num_classes:
        logger.warning(
            f"dataset {cfg['name']} has {dataset.num_classes} classes, exp.num_classes = "
            f"{exp.num_classes}: the extra outputs are never trained"
        )
    mode = _cache_mode(cache)
    if mode is not None:
        image_cache = build_cache(dataset, mode, cache_dir=exp.cache_dir, strict=exp.cache_strict)
        if image_cache is not None:
            dataset.attach_cache(image_cache)
    return dataset


def _shared_seed(exp) -> int:
    """exp.seed, or one random seed drawn on rank 0 and shared so every rank shards the same permutation."""
    if exp.seed is not None:
        return int(exp.seed)
    return int(dist_utils.broadcast_object(int(torch.randint(0, 2**31 - 1, ()).item())))


def build_train_loader(
    exp, batch_size: int, is_distributed: bool, no_aug: bool = False, cache: None | bool | str = None
) -> TrainLoader:
    """Infinite mosaic/MixUp training loader; `batch_size` is per process. See TrainLoader."""
    dataset = build_train_dataset(exp, cache=cache)
    box_filter = (exp.box_min_size, exp.box_min_area_ratio, exp.box_max_aspect)
    seed = _shared_seed(exp)
    mosaic = MosaicDetection(
        dataset,
        img_size=exp.input_size,
        mosaic=not no_aug,
        transform=TrainTransform(
            max_labels=exp.max_labels, flip_prob=exp.flip_prob, hsv_prob=exp.hsv_prob, box_filter=box_filter
        ),
        degrees=exp.degrees,
        translate=exp.translate,
        mosaic_scale=exp.mosaic_scale,
        mixup_scale=exp.mixup_scale,
        shear=exp.shear,
        enable_mixup=exp.enable_mixup,
        mosaic_prob=exp.mosaic_prob,
        mixup_prob=exp.mixup_prob,
        box_filter=box_filter,
        seed=seed,
        affine_pivot=exp.affine_pivot,
    )
    rank, world = (dist_utils.get_rank(), dist_utils.get_world_size()) if is_distributed else (0, 1)
    sampler = InfiniteSampler(len(dataset), shuffle=True, seed=seed, rank=rank, world_size=world)
    batch_sampler = YoloBatchSampler(sampler, batch_size, mosaic=not no_aug)
    return TrainLoader(
        mosaic,
        batch_sampler,
        exp.data_num_workers,
        exp.max_labels,
        pin_memory=torch.cuda.is_available(),
        worker_nice=worker_nice(exp),
    )


def worker_nice(exp) -> int:
    """The niceness training loader workers add to their own: exp.data_worker_nice, or by default 19 (the
    lowest priority) where the model runs on the CPU and 0 on a GPU.

    On a CPU the workers share the cores with the step's OpenMP threads, which meet at a barrier after every
    operation: a worker that takes a core from one thread for a few milliseconds stalls the other too. At
    the lowest priority the workers mostly run while the step waits for its next batch (YOLOX-Nano, 320 px,
    batch 16 on 2 cores: 1.09-1.11x iterations, `python tools/benchmark.py workers`). On a GPU the training
    threads mostly wait for the device, and the workers must keep it fed at full priority. Evaluation's
    loader keeps its priority: it measured no faster at 19 (0.98-1.02x).
    """
    if exp.data_worker_nice is not None:
        return exp.data_worker_nice
    return 19 if dist_utils.local_device().type == "cpu" else 0


def build_eval_dataset(exp) -> DetectionDataset:
    """The validation split, items letterboxed to exp.test_size (see DetectionDataset.__getitem__)."""
    return _dataset(exp, dataset_config(exp), "val", exp.test_size)


def build_calibration_dataset(exp) -> DetectionDataset:
    """The training split with evaluation's items (letterboxed to exp.test_size, no augmentation): the
    images an INT8 export calibrates its activation ranges on."""
    return _dataset(exp, dataset_config(exp), "train", exp.test_size)


def build_eval_loader(exp, batch_size: int, is_distributed: bool) -> DataLoader:
    """Eval loader: rank r gets items r::world (each image once over all ranks); batches per eval_collate.

    Its workers persist from the first evaluation to the loader's end: the trainer's per-epoch evaluations
    would otherwise fork them anew every time from a process that has since grown, and pay copy-on-write
    faults for every shared page it then writes; and a process that keeps freed memory for reuse
    (`utils.allocator`) only shares with them what it held at that one fork.
    """
    dataset = build_eval_dataset(exp)
    rank, world = (dist_utils.get_rank(), dist_utils.get_world_size()) if is_distributed else (0, 1)
    opencv_for_workers(exp.data_num_workers)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=ShardSampler(len(dataset), rank=rank, world_size=world),
        num_workers=exp.data_num_workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=exp.data_num_workers > 0,
        worker_init_fn=worker_init,
        collate_fn=eval_collate,
    )
