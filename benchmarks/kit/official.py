"""Official YOLOX 0.3.0 driven on a CPU: its training pieces in a plain loop, and its COCO evaluation.

Needs the reference environment (`tools/setup_yolox_reference.sh`). Official's Trainer and
COCOEvaluator.evaluate are CUDA-only (device "cuda:N", torch.cuda tensors); everything they call is not,
so both are repeated here from their source, in their order, with only the CUDA calls left out:

- training (`core/trainer.py`): the exp's model, SGD parameter groups (`exp.get_optimizer`), data loader
  (MosaicDetection + TrainTransform + YoloBatchSampler + InfiniteSampler + its DataLoader), `yoloxwarmcos`
  LRScheduler and ModelEMA(0.9998). One loader iterator for the whole run (its DataPrefetcher holds one, so
  batches prefetched before close_mosaic still come with mosaic). The lr is set after each step for the
  next one (`update_lr(progress + 1)`); the first step runs at the optimizer's initial lr (warmup_lr).
  At the start of epoch e (0-based) with e + 1 == max_epoch - no_aug_epochs: close_mosaic, L1 on,
  eval_interval = 1. After epoch e: evaluate the EMA model when (e + 1) % eval_interval == 0.
  Multi-scale is drawn only when asked (`multiscale`); BN statistics need no all-reduce (one process);
  no checkpoints are written.
- evaluation (`evaluators/coco_evaluator.py`): forward, `postprocess(conf, nms)`, its
  `convert_to_coco_format` and `evaluate_prediction` (pycocotools, or its compiled COCOeval when built).
"""

from __future__ import annotations

import contextlib
import io
import random
import sys
import time
from collections.abc import Callable

import torch

from yolox_fast.models.simota import RULE_0_3_0

# YOLOX 0.3.0's SimOTA rule as yolox_fast's exp fields (yolox_fast's default is official's later rule): set on
# our side wherever yolox_fast is held to 0.3.0's numbers or timed against its work
RULE_0_3_0_FIELDS = {f"simota_{key}": value for key, value in RULE_0_3_0.items()}


def with_rule_0_3_0(exp):
    """yolox_fast's `exp`, with YOLOX 0.3.0's SimOTA rule set."""
    for key, value in RULE_0_3_0_FIELDS.items():
        setattr(exp, key, value)
    return exp


def require_official_yolox(suite: str) -> None:
    """Exit with the command to use when official YOLOX 0.3.0 is not importable (the reference python)."""
    try:
        import yolox
    except ImportError:
        sys.exit(
            "official YOLOX is not importable: run this with the reference python, e.g.\n"
            f"  $(tools/setup_yolox_reference.sh) tools/benchmark.py {suite}"
        )
    if yolox.__version__ != "0.3.0":
        sys.exit(f"found YOLOX {yolox.__version__}, this compares with 0.3.0")


def official_nano_exp(fields: dict):
    """Official's yolox-nano exp with `fields` set (attribute -> value)."""
    from yolox.exp import get_exp

    exp = get_exp(None, "yolox-nano")
    for key, value in fields.items():
        if not hasattr(exp, key):
            raise AttributeError(f"official YOLOX's exp has no field {key!r}")
        setattr(exp, key, value)
    return exp


@torch.no_grad()
def official_detections(evaluator, model) -> list[dict]:
    """COCOEvaluator.evaluate's inference part on the model's device: COCO result records."""
    from yolox.utils import postprocess

    training = model.training
    model.eval()
    device = next(model.parameters()).device
    records = []
    for imgs, _, info_imgs, ids in evaluator.dataloader:
        outputs = model(imgs.to(device).float())
        outputs = postprocess(outputs, evaluator.num_classes, evaluator.confthre, evaluator.nmsthre)
        records.extend(evaluator.convert_to_coco_format(outputs, info_imgs, ids))
    model.train(training)
    return records


def official_evaluate(evaluator, model) -> tuple[float, float]:
    """(AP50:95, AP50) as COCOEvaluator.evaluate computes them."""
    return official_score(evaluator, official_detections(evaluator, model))


def official_score(evaluator, records: list[dict]) -> tuple[float, float]:
    """(AP50:95, AP50) of COCO result records, scored by COCOEvaluator.evaluate_prediction."""
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' progress lines
        ap50_95, ap50, _ = evaluator.evaluate_prediction(records, torch.tensor([0.0, 0.0, 1.0]))
    return float(ap50_95), float(ap50)


def use_later_assignment_rule() -> None:
    """Give official 0.3.0's head the SimOTA candidate rule of official's later code: candidates are the
    anchors within 1.5 strides of a GT's centre (0.3.0: inside its box or within 2.5 strides), and the cost
    is free only there. Everything else in 0.3.0's assignment (costs, dynamic k, conflicts) is unchanged,
    as it is in the later code."""
    from yolox.models.yolo_head import YOLOXHead

    def get_in_boxes_info(self, gt_bboxes_per_image, expanded_strides, x_shifts, y_shifts, total_num_anchors,
                          num_gt):  # fmt: skip
        strides = expanded_strides[0]  # (A,)
        x_centres = ((x_shifts[0] + 0.5) * strides).unsqueeze(0)  # (1, A) px
        y_centres = ((y_shifts[0] + 0.5) * strides).unsqueeze(0)
        reach = 1.5 * strides.unsqueeze(0)  # (1, A) px
        gt_x, gt_y = gt_bboxes_per_image[:, 0:1], gt_bboxes_per_image[:, 1:2]  # (G, 1) px
        deltas = torch.stack(
            [x_centres - (gt_x - reach), y_centres - (gt_y - reach), gt_x + reach - x_centres,
             gt_y + reach - y_centres], 2)  # fmt: skip
        in_centre = deltas.min(dim=-1).values > 0.0  # (G, A)
        candidates = in_centre.any(dim=0)  # (A,)
        return candidates, in_centre[:, candidates]

    YOLOXHead.get_in_boxes_info = get_in_boxes_info


def official_random_size(exp) -> tuple[int, int]:
    """The next multi-scale input size, drawn as official's `Exp.random_resize` draws it on rank 0."""
    factor = exp.input_size[1] * 1.0 / exp.input_size[0]
    if not hasattr(exp, "random_size"):
        exp.random_size = (
            int(exp.input_size[0] / 32) - exp.multiscale_range,
            int(exp.input_size[0] / 32) + exp.multiscale_range,
        )
    size = random.randint(*exp.random_size)
    return int(32 * size), 32 * int(size * factor)


def official_model(exp, weights: str | None):
    """`exp.get_model()` in train mode, with `weights` (a checkpoint file) loaded as official's
    `tools/train.py -c` loads them (`load_ckpt`: tensors of another shape are skipped)."""
    from yolox.utils import load_ckpt

    model = exp.get_model()
    if weights:
        with contextlib.redirect_stderr(io.StringIO()):  # its warnings name each skipped tensor
            load_ckpt(model, torch.load(weights, map_location="cpu", weights_only=False)["model"])
    return model.train()


def train_official(
    exp,
    batch_size: int,
    seed: int,
    on_epoch: Callable[[dict], None] | None = None,
    weights: str | None = None,
    time_limit: float | None = None,
    multiscale: bool = False,
    train_loader=None,
) -> tuple[list[dict], dict]:
    """Train `exp` as official's Trainer would, on this process's device (CPU).

    `weights`: a checkpoint to fine-tune from, loaded as official's `tools/train.py -c` loads it
    (`load_ckpt`: tensors of another shape are skipped). `time_limit`: seconds of training after which
    the run stops at the end of the step, and its EMA model is evaluated (a run stopped where another
    one ended). Returns (one dict per epoch {"epoch" (1-based), "train_seconds", "loss" (mean total
    loss of its steps), and when evaluated "ap50_95", "ap50"}, {"iters_per_epoch", "steps"}).
    `on_epoch` is called with each epoch's dict as it finishes. `train_loader`: another loader's batches in
    place of official's own (one with len(), close_mosaic() and endless iteration yielding imgs (B, 3, H, W)
    BGR 0-255 and targets (B, L, 5) [cls, cx, cy, w, h] px first, as official's and yolox_fast's do), so
    the rest of official's loop trains on them.
    """
    from yolox.utils import ModelEMA

    exp.seed = seed
    random.seed(seed)  # official tools/train.py seeds python and torch (not numpy) when exp.seed is set
    torch.manual_seed(seed)
    model = official_model(exp, weights)
    optimizer = exp.get_optimizer(batch_size)
    if train_loader is None:
        train_loader = exp.get_data_loader(
            batch_size=batch_size, is_distributed=False, no_aug=False, cache_img=False
        )
    max_iter = len(train_loader)
    lr_scheduler = exp.get_lr_scheduler(exp.basic_lr_per_img * batch_size, max_iter)
    ema = ModelEMA(model, 0.9998)
    evaluator = exp.get_evaluator(batch_size=batch_size, is_distributed=False)
    batches = iter(train_loader)
    epochs, steps, start = [], 0, time.perf_counter()
    input_size = exp.input_size
    for epoch in range(exp.max_epoch):
        t0, losses = time.perf_counter(), []
        out_of_time = False
        if epoch + 1 == exp.max_epoch - exp.no_aug_epochs:
            train_loader.close_mosaic()
            model.head.use_l1 = True
            exp.eval_interval = 1
        for it in range(max_iter):
            inps, targets = next(batches)[:2]
            inps, targets = exp.preprocess(inps.float(), targets.float(), input_size)
            loss = model(inps, targets)["total_loss"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ema.update(model)
            lr = lr_scheduler.update_lr(epoch * max_iter + it + 1)
            for group in optimizer.param_groups:
                group["lr"] = lr
            steps += 1
            losses.append(float(loss.detach()))
            if multiscale and (epoch * max_iter + it + 1) % 10 == 0:
                input_size = official_random_size(exp)
            if time_limit is not None and time.perf_counter() - start >= time_limit:
                out_of_time = True
                break
        record = {
            "epoch": epoch + 1,
            "train_seconds": time.perf_counter() - t0,
            "loss": sum(losses) / len(losses),
        }
        if (epoch + 1) % exp.eval_interval == 0 or out_of_time:
            record["ap50_95"], record["ap50"] = official_evaluate(evaluator, ema.ema)
        epochs.append(record)
        if on_epoch is not None:
            on_epoch(record)
        if out_of_time:
            break
    return epochs, {"iters_per_epoch": max_iter, "steps": steps}
