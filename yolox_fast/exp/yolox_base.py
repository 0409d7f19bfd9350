"""Exp: the YOLOX recipe (COCO, 300 epochs) with every field a YOLOX user knows, same names, same meaning."""

from __future__ import annotations

import inspect
import os
import random
import re
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from yolox_fast.exp.base_exp import BaseExp
from yolox_fast.utils import dist as dist_utils
from yolox_fast.utils.compile import MODES as COMPILE_MODES


def default_exp_name(cls: type) -> str:
    """The stem of the file that defines `cls` (`exps/yolox_s.py` -> "yolox_s", as YOLOX), or, for a class
    whose file cannot be found (made in a notebook, loaded without registering its module), the last part
    of its module's name, or the class name in snake case."""
    try:
        stem = os.path.splitext(os.path.basename(inspect.getfile(cls)))[0]
        if stem != "__main__":  # `python -m pkg` or an interactive session's main module
            return stem
    except (TypeError, OSError):
        pass
    module = (cls.__module__ or "").rsplit(".", 1)[-1]
    if module and module not in ("__main__", "builtins") and not module.startswith("_"):
        return module
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


SIZE = tuple[int, int]  # (height, width) px
RANGE = tuple[float, float]  # (low, high)


class Exp(BaseExp):
    """The YOLOX recipe. Every field is an annotated class attribute (its type, its default, why), so `merge`
    (the command line's KEY VALUE overrides) and `validate` (the trainer's start) check types and shapes,
    not only names. An exp file overrides what differs, in `__init__` as YOLOX's do, or as class
    attributes."""

    # ---------------- model ---------------- #
    num_classes: int | None = 80  # None: as many as the dataset has (tools resolve it at start)
    depth: float = 1.00  # factor of the number of blocks in each CSP stage
    width: float = 1.00  # factor of the number of channels
    act: Literal["silu", "relu", "lrelu"] = "silu"
    depthwise: bool = False  # depthwise-separable convs in backbone, neck and head (nano)
    grad_checkpoint: bool = False  # recompute backbone/neck activations in backward to fit bigger batches
    # train in NHWC memory format: oneDNN (CPU) and tensor cores (CUDA) run its convolutions faster
    # (yolox-nano 320 px on a 2-core CPU: 1.37x per step); the weights and results are the same
    channels_last: bool = True
    # torch.compile the model for training and evaluation (tools' --compile): off, because its minutes
    # of compiling only pay back in long runs (docs/training.md, "torch.compile"); compile_mode and
    # compile_backend are torch.compile's ("aot_eager" traces without generating kernels: a quick check)
    compile: bool = False
    compile_mode: Literal[COMPILE_MODES] = "default"
    compile_backend: str = "inductor"

    # ---------------- data ---------------- #
    # The dataset: a built-in description ("coco", "voc", "shapes"), a description .json or an
    # Ultralytics data.yaml. YOLOX's data_dir means "my data, laid out as this description says"
    # (class names then come from its annotation files); train_ann / val_ann, when set, replace
    # the description's annotation files. None: the description's own.
    dataset: str = "coco"
    data_dir: str | None = None
    train_ann: str | None = None
    val_ann: str | None = None
    test_ann: str = "instances_test2017.json"
    class_names: tuple[str, ...] | None = None  # None: taken from the dataset
    data_num_workers: int = 4
    # niceness (os.nice, 0-19) the training loader's workers add to their own; None: 19 when the model
    # runs on the CPU, where the workers share its cores (at the lowest priority they mostly take what the
    # training threads leave: nano trains about 1.1x faster on 2 cores), 0 on a GPU, which they must feed
    data_worker_nice: int | None = None
    input_size: SIZE = (640, 640)  # (height, width)
    # multi-scale training draws sizes in [input_size - 32 * range, input_size + 32 * range];
    # 0 turns it off. random_size = (min, max) in units of 32 takes precedence when set.
    multiscale_range: int = 5
    random_size: tuple[int, int] | None = None
    max_labels: int = 120  # labels per image after augmentation; extra ones are dropped (logged once)
    # True: a missing image file (or bad YOLO label line) is skipped and counted, not an error; and no
    # share of damaged images stops the run
    skip_corrupt_images: bool = False
    # an image that cannot be decoded whole is skipped with one warning and counted; the run stops when
    # more than this share of the training split is damaged (0: at the first one)
    max_corrupt_fraction: float = 0.01
    cache_dir: str | None = None  # --cache disk writes here (default datasets/.cache/)
    cache_strict: bool = False  # True: a cache that does not fit is an error instead of running uncached

    # ---------------- augmentation ---------------- #
    mosaic_prob: float = 1.0
    mixup_prob: float = 1.0
    hsv_prob: float = 1.0
    flip_prob: float = 0.5
    degrees: float = 10.0
    translate: float = 0.1
    mosaic_scale: RANGE = (0.1, 2)
    enable_mixup: bool = True
    mixup_scale: RANGE = (0.5, 1.5)
    shear: float = 2.0
    # where the mosaic's rotation/scale/shear act: "centre" maps the mosaic canvas's centre to the
    # output's centre; "origin" maps its top-left corner to the output's (official YOLOX 0.3.0)
    affine_pivot: Literal["centre", "origin"] = "centre"
    # box_candidates after every geometric transform: keep boxes wider and taller than box_min_size px,
    # keeping at least box_min_area_ratio of their area, aspect ratio below box_max_aspect. The defaults
    # keep what official YOLOX 0.3.0 keeps (min side > 1 px, however much was cut off): on real photos
    # fine-tuned from COCO weights they train better than YOLOv5's (2 px, 0.1, 20), most of all in the
    # early epochs (docs/results.md, "Fine-tuning on real photos")
    box_min_size: float = 1.0
    box_min_area_ratio: float = 0.0
    box_max_aspect: float = float("inf")

    # ---------------- training ---------------- #
    batch_size: int = 64  # total batch over all processes when tools/train.py gets no -b
    # images per optimizer step (Ultralytics' nbs): -b 16 with 64 accumulates 4 batches per step, and lr,
    # warmup and EMA follow the 64 (core/accumulation.py); None: one batch per step
    nominal_batch_size: int | None = None
    warmup_epochs: float = 5
    max_epoch: int = 300
    warmup_lr: float = 0
    min_lr_ratio: float = 0.05
    basic_lr_per_img: float = 0.01 / 64.0  # lr = basic_lr_per_img * total batch size
    scheduler: Literal["yoloxwarmcos", "warmcos", "cos", "multistep"] = "yoloxwarmcos"
    no_aug_epochs: int = 15  # the last epochs: no mosaic/mixup, L1 loss on
    ema: bool = True
    # the EMA decay ramps up as 0.9998 * (1 - exp(-updates / ema_ramp)): YOLOX's 2000 updates
    ema_ramp: float = 2000.0
    weight_decay: float = 5e-4
    momentum: float = 0.9
    # clip the gradients' total L2 norm to this value before each step; None: no clipping (YOLOX)
    clip_grad_norm: float | None = None
    # what --fp16 means on a CPU: "bf16" (bfloat16 autocast, no loss scaling: fast on CPUs), or "fp16",
    # float16 autocast with loss scaling, the path every --fp16 GPU run takes, to try it out on a CPU
    # (slower than bf16 and fp32 there: docs/training.md, "Mixed precision")
    cpu_amp_dtype: Literal["bf16", "fp16"] = "bf16"
    # the fp16 loss scaler (torch.amp.GradScaler): its first scale, and the overflow-free steps after
    # which it doubles the scale (an overflow halves it and skips the step); torch's defaults
    scaler_init_scale: float = 65536.0
    scaler_growth_interval: int = 2000
    # ---------------- fine-tuning (-c weights) ---------------- #
    # parts that keep the weights they start from: "none", "backbone" (CSPDarknet) or "backbone+neck"
    # (and PAFPN); their BatchNorm layers stay in eval mode, their statistics frozen too
    freeze: Literal["none", "backbone", "backbone+neck"] = "none"
    # stop after this many evaluations in a row without a better best_metric (None: never)
    patience: int | None = None
    # -c weights whose BatchNorm was folded into the convolutions (identity statistics, as in weights
    # rebuilt from an ONNX export) get their statistics re-estimated on training images first, so that
    # training starts from the weights' function (models/folded_bn.py)
    refit_folded_bn: bool = True
    print_interval = 10  # optimizer steps between progress lines (declared by BaseExp)
    save_history_ckpt: bool = True
    exp_name: str  # set by __init__: the stem of the exp's file (default_exp_name)

    # ---------------- assignment ---------------- #
    # The later YOLOX rule: candidates are the anchors within simota_center_radius strides of a GT's
    # centre. It fine-tunes better than 0.3.0's rule on real photos (docs/results.md, "Fine-tuning");
    # simota_box_prior True with radius 2.5 is 0.3.0's (anchors inside the GT's box count too).
    simota_box_prior: bool = False
    simota_center_radius: float = 1.5
    simota_topk: int = 10
    simota_max_bytes: int | None = None  # None: a fraction of free device memory

    # ---------------- testing ---------------- #
    test_size: SIZE = (640, 640)
    test_conf: float = 0.01
    nmsthre: float = 0.65

    # ---------------- evaluation report and best checkpoint ---------------- #
    best_metric: Literal["AP50_95", "AP50"] = (
        "AP50_95"  # what best_ckpt.pth keeps the best of: "AP50_95" or "AP50"
    )
    report_conf: float = 0.25  # confidence of the precision / recall columns of the per-class table
    cm_conf: float = 0.25  # confusion matrix: detections with score >= cm_conf, matched ...
    cm_iou: float = 0.45  # ... to ground truth at IoU >= cm_iou
    # COCO AP by "auto" (faster-coco-eval when installed), "faster-coco-eval" or "pycocotools"
    coco_scorer: Literal["auto", "faster-coco-eval", "pycocotools"] = "auto"
    save_eval_report: bool = True  # training evals write eval/, best_eval/ and TensorBoard pictures

    def __init__(self) -> None:
        super().__init__()
        self.exp_name = default_exp_name(type(self))

    def validate(self) -> None:
        """Types and shapes of every field (BaseExp.validate), then the ranges of the EMA ramp, the loss
        scaler's fields and the evaluation thresholds."""
        super().validate()
        if self.ema_ramp <= 0:
            raise ValueError(
                f"exp.ema_ramp must be > 0 (updates over which the EMA decay ramps up), got {self.ema_ramp}"
            )
        if not self.scaler_init_scale > 0 or self.scaler_growth_interval < 1:
            raise ValueError(
                f"exp.scaler_init_scale must be > 0 and exp.scaler_growth_interval >= 1 (steps), got "
                f"{self.scaler_init_scale} and {self.scaler_growth_interval}"
            )
        if self.data_worker_nice is not None and not 0 <= self.data_worker_nice <= 19:
            raise ValueError(
                "exp.data_worker_nice is the niceness loader workers add to their own, 0-19 (0: the training "
                f"process's priority, 19: the lowest), or None for the default; got {self.data_worker_nice}"
            )
        if not 0 <= self.max_corrupt_fraction <= 1:
            raise ValueError(
                "exp.max_corrupt_fraction is the share of the training images that may be damaged before the "
                f"run stops, 0-1; got {self.max_corrupt_fraction}"
            )
        from yolox_fast.evaluators.report import check_report_settings

        check_report_settings(self.report_conf, self.cm_conf, self.cm_iou)

    # ------------------------------------------------------------------ model
    def get_model(self) -> nn.Module:
        """YOLOX with this exp's depth/width/act; BN eps/momentum and head biases as in YOLOX."""
        from yolox_fast.models import YOLOPAFPN, YOLOX, YOLOXHead
        from yolox_fast.models.losses import YOLOXLoss

        if self.num_classes is None:
            raise ValueError("exp.num_classes is None (the dataset's count): resolve_num_classes() first")
        if getattr(self, "model", None) is None:
            in_channels = [256, 512, 1024]
            backbone = YOLOPAFPN(
                self.depth, self.width, in_channels=in_channels, act=self.act, depthwise=self.depthwise
            )
            loss_fn = YOLOXLoss(
                center_radius=self.simota_center_radius,
                box_prior=self.simota_box_prior,
                topk=self.simota_topk,
                max_bytes=self.simota_max_bytes,
            )
            head = YOLOXHead(
                self.num_classes,
                self.width,
                in_channels=in_channels,
                act=self.act,
                depthwise=self.depthwise,
                loss_fn=loss_fn,
            )
            self.model = YOLOX(backbone, head)
            for m in self.model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eps = 1e-3
                    m.momentum = 0.03
            self.model.head.initialize_biases(1e-2)
        if self.grad_checkpoint:
            self.model.set_grad_checkpointing(True)
        self.model.train()
        return self.model

    def resolve_num_classes(self, ckpt: str | None = None) -> None:
        """num_classes None -> the number of the dataset's class names, else of the checkpoint's (a
        checkpoint written by yolox_fast carries them): for an exp that adapts to the data it is given."""
        if self.num_classes is not None:
            return
        try:
            self.num_classes = len(self.get_class_names())
            return
        except (FileNotFoundError, ValueError) as err:
            reason = err
        if ckpt:
            from yolox_fast.utils.checkpoint import load_checkpoint

            names = load_checkpoint(ckpt).get("class_names")
            if names:
                self.num_classes = len(names)
                return
        raise ValueError(
            f"exp.num_classes is None (as many as the dataset has), but the dataset cannot be read "
            f"({reason}); "
            "give num_classes N or a dataset"
        )

    def get_class_names(self) -> tuple[str, ...]:
        """Class names: `self.class_names` if set, else the dataset's (see `data.build.dataset_config`)."""
        if self.class_names:
            return tuple(self.class_names)
        from yolox_fast.data.build import dataset_class_names

        return dataset_class_names(self)

    # ------------------------------------------------------------------ data
    def prepare_dataset(self) -> None:
        """Generate the built-in synthetic set if this exp's dataset is it and it is missing (no-op
        otherwise). The trainer and the tools call it before building loaders."""
        from yolox_fast.data.build import prepare_dataset

        prepare_dataset(self)

    def get_dataset(self, cache: str | None = None):
        """The training split, un-augmented (images letterboxed to input_size), optionally cached."""
        from yolox_fast.data.build import build_train_dataset

        return build_train_dataset(self, cache=cache)

    def get_data_loader(self, batch_size: int, is_distributed: bool, no_aug: bool = False, cache_img=None):
        """Infinite training loader (mosaic/mixup unless no_aug); len() = iterations per epoch.

        Yields (imgs (B, 3, H, W) uint8 BGR, targets (B, max_labels, 5) [cls, cx, cy, w, h] px
        zero-padded, img_info, img_ids); `loader.close_mosaic()` turns mosaic and mixup off.
        `batch_size` is per process.
        """
        from yolox_fast.data.build import build_train_loader

        return build_train_loader(self, batch_size, is_distributed, no_aug=no_aug, cache=cache_img)

    def get_eval_dataset(self):
        from yolox_fast.data.build import build_eval_dataset

        return build_eval_dataset(self)

    def get_eval_loader(self, batch_size: int, is_distributed: bool):
        """Eval loader over the validation split: each rank a disjoint shard, no duplicates."""
        from yolox_fast.data.build import build_eval_loader

        return build_eval_loader(self, batch_size, is_distributed)

    def multiscale_factors(self) -> range:
        """The training sizes `random_resize` draws from, in units of 32 px of the input height."""
        if self.random_size is not None:
            lo, hi = self.random_size
        else:
            base = int(self.input_size[0] / 32)
            lo, hi = base - self.multiscale_range, base + self.multiscale_range
        return range(lo, hi + 1)

    def random_resize(self, data_loader, epoch: int, rank: int, is_distributed: bool) -> tuple[int, int]:
        """Draw the next multi-scale input size on rank 0 and share it, so every rank agrees."""
        size = None
        if rank == 0:
            factors = self.multiscale_factors()
            factor = random.randint(factors[0], factors[-1])  # randint, as YOLOX: the same sizes per seed
            aspect = self.input_size[1] / self.input_size[0]
            size = (int(32 * factor), 32 * int(factor * aspect))
        if is_distributed and dist.is_initialized():
            size = dist_utils.broadcast_object(size, src=0)
        return tuple(size)

    def preprocess(self, inputs: torch.Tensor, targets: torch.Tensor, tsize: tuple[int, int]):
        """Resize a batch (B, 3, H, W) and its targets (B, M, 5) px to `tsize` (h, w)."""
        scale_y = tsize[0] / inputs.shape[2]
        scale_x = tsize[1] / inputs.shape[3]
        if scale_x != 1 or scale_y != 1:
            inputs = F.interpolate(inputs, size=tsize, mode="bilinear", align_corners=False)
            targets = targets.clone()
            targets[..., 1::2] *= scale_x
            targets[..., 2::2] *= scale_y
        return inputs, targets

    # ------------------------------------------------------------------ optimisation
    def get_optimizer(self, batch_size: int) -> torch.optim.Optimizer:
        """SGD (nesterov) with three groups: BN weights and biases carry no weight decay.

        `batch_size` is the total batch over all ranks; lr = basic_lr_per_img * batch_size
        (warmup starts from warmup_lr when warmup_epochs > 0).
        """
        if getattr(self, "optimizer", None) is None:
            lr = self.warmup_lr if self.warmup_epochs > 0 else self.basic_lr_per_img * batch_size
            no_decay_bn: list[nn.Parameter] = []
            decay: list[nn.Parameter] = []
            biases: list[nn.Parameter] = []
            for name, module in self.model.named_modules():
                if hasattr(module, "bias") and isinstance(module.bias, nn.Parameter):
                    biases.append(module.bias)
                if isinstance(module, nn.BatchNorm2d) or "bn" in name:
                    no_decay_bn.append(module.weight)
                elif hasattr(module, "weight") and isinstance(module.weight, nn.Parameter):
                    decay.append(module.weight)
            # foreach: one fused kernel per group instead of a Python loop over ~600 tensors (the same
            # arithmetic; torch picks it by itself on CUDA only)
            optimizer = torch.optim.SGD(
                no_decay_bn, lr=lr, momentum=self.momentum, nesterov=True, foreach=True
            )
            optimizer.add_param_group({"params": decay, "weight_decay": self.weight_decay})
            optimizer.add_param_group({"params": biases})
            self.optimizer = optimizer
        return self.optimizer

    def get_lr_scheduler(self, lr: float, iters_per_epoch: int, **kwargs):
        from yolox_fast.utils.lr_scheduler import LRScheduler

        return LRScheduler(
            self.scheduler,
            lr,
            iters_per_epoch,
            self.max_epoch,
            warmup_epochs=self.warmup_epochs,
            warmup_lr_start=self.warmup_lr,
            no_aug_epochs=self.no_aug_epochs,
            min_lr_ratio=self.min_lr_ratio,
            **kwargs,
        )

    # ------------------------------------------------------------------ evaluation
    def get_evaluator(self, batch_size: int, is_distributed: bool):
        """COCO- or VOC-style evaluator (by the dataset description's format) over the val split."""
        from yolox_fast.evaluators.build import build_evaluator

        return build_evaluator(self, batch_size, is_distributed)

    def eval(self, model, evaluator, is_distributed: bool, half: bool = False):
        """(ap50_95, ap50, summary text) of `model` on the evaluator's split."""
        return evaluator.evaluate(model, is_distributed, half)
