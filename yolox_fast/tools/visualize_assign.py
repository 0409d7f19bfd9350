"""Draw SimOTA's assignment on training images: each GT box and the centres of the anchors it was given.

    python tools/visualize_assign.py -f exps/example/shapes_nano.py -c best_ckpt.pth -o assign_vis/
    python tools/visualize_assign.py -n yolox-s -b 4 --no-aug

A batch from the exp's training loader (with the exp's augmentation, mosaic included, unless
--no-aug) goes through the model in train mode, exactly as in training; the head's predictions are
captured at the loss and assigned with `simota_assign`. One PNG per image: every GT in its own
colour, its anchors as dots of that colour (radius about stride / 5 px, times --scale: bigger dots
for coarser levels), and "k" = its number of anchors next to the box.
Without -c the weights are random (as at the start of training).
"""

from __future__ import annotations

import argparse
import colorsys
from pathlib import Path

import cv2
import numpy as np
import torch
from loguru import logger

from yolox_fast.core.cli import add_exp_arguments, build_exp, parse_with_overrides, run_tool
from yolox_fast.models.simota import SimOTAResult, simota_assign
from yolox_fast.utils.checkpoint import load_checkpoint, load_model_weights, model_state_dict
from yolox_fast.utils.visualize import class_name, draw_boxes


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("yolox_fast SimOTA assignment visualiser")
    add_exp_arguments(p, "checkpoint (ours or official YOLOX); without it the weights are random")
    p.add_argument("-b", "--batch-size", type=int, default=4, help="images to draw")
    p.add_argument("-o", "--output-dir", default="assign_vis", help="where the PNGs go")
    p.add_argument("--no-aug", action="store_true", help="plain letterboxed images instead of mosaic")
    p.add_argument(
        "--scale", type=float, default=2.0, help="drawing magnification (small inputs are hard to read)"
    )
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    return p


def gt_color(index: int) -> tuple:
    """A BGR colour per GT index; golden-ratio hue steps keep neighbouring GTs apart."""
    r, g, b = colorsys.hsv_to_rgb((index * 0.618033988749895) % 1.0, 0.9, 1.0)
    return int(255 * b), int(255 * g), int(255 * r)


def recording_loss(captured: dict[str, object], loss):
    """A head `loss_fn` that records its arguments in `captured`, then computes the head's `loss`."""
    names = ("pred_boxes", "obj_logits", "cls_logits", "raw_reg", "grids", "strides", "labels")

    def loss_fn(*args, **kwargs):
        captured.update(zip(names, args))
        captured.update(kwargs)
        return loss(*args, **kwargs)

    return loss_fn


def assign_batch(model: torch.nn.Module, imgs: torch.Tensor, targets: torch.Tensor):
    """Run the model in train mode on the batch; return the captured loss inputs and their assignment."""
    seen: dict[str, object] = {}
    head = model.head
    real = head.loss_fn
    head.loss_fn = recording_loss(seen, real)
    model.train()
    try:
        with torch.no_grad():
            model(imgs, targets)
    finally:
        head.loss_fn = real
    anchor_points = (seen["grids"] + 0.5) * seen["strides"][:, None]
    labels = seen["labels"]
    result = simota_assign(
        seen["pred_boxes"],
        seen["cls_logits"],
        seen["obj_logits"],
        anchor_points,
        seen["strides"],
        labels[..., 1:5],
        labels[..., 0].long(),
        labels.sum(-1) > 0,
        center_radius=real.center_radius,
        box_prior=real.box_prior,
        topk=real.topk,
        max_bytes=real.max_bytes,
    )
    return anchor_points, seen["strides"], result


def draw_assignment(
    img: np.ndarray,
    labels: np.ndarray,
    anchor_points: np.ndarray,
    strides: np.ndarray,
    fg: np.ndarray,
    matched: np.ndarray,
    class_names,
    scale: float = 1.0,
) -> np.ndarray:
    """BGR uint8 img (H, W, 3) magnified by `scale`, with GT boxes (labels (M, 5) [cls, cx, cy, w, h] px,
    zero rows = padding) and, per GT, dots at its anchors (fg (A,) bool, matched (A,) GT index,
    anchor_points (A, 2) px, strides (A,)) in the GT's colour."""
    out = cv2.resize(img, None, fx=scale, fy=scale, interpolation=cv2.INTER_NEAREST)
    anchor_points = anchor_points * scale
    valid = [g for g, row in enumerate(labels) if row.sum() > 0]
    boxes, texts, colors = [], [], []
    for g in valid:
        cls, cx, cy, w, h = labels[g]
        cx, cy, w, h = cx * scale, cy * scale, w * scale, h * scale
        mine = fg & (matched == g)
        for (x, y), s in zip(anchor_points[mine], strides[mine]):
            radius = max(2, round(scale * s / 5))
            cv2.circle(out, (round(x), round(y)), radius, gt_color(g), -1, cv2.LINE_AA)
        boxes.append([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
        texts.append(f"{class_name(class_names, int(cls))} k={int(mine.sum())}")
        colors.append(gt_color(g))
    out = draw_boxes(out, np.array(boxes).reshape(-1, 4), texts, colors, thickness=1)
    return out


def save_images(
    out_dir: Path,
    imgs: torch.Tensor,
    targets: torch.Tensor,
    anchor_points: torch.Tensor,
    strides: torch.Tensor,
    result: SimOTAResult,
    class_names,
    scale: float,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    points, strides = anchor_points.cpu().numpy(), strides.cpu().numpy()
    for i in range(imgs.shape[0]):
        img = imgs[i].permute(1, 2, 0).clamp(0, 255).byte().cpu().numpy()  # BGR, as the loader gives it
        drawn = draw_assignment(
            np.ascontiguousarray(img),
            targets[i].cpu().numpy(),
            points,
            strides,
            result.fg_mask[i].cpu().numpy(),
            result.matched_gt[i].cpu().numpy(),
            class_names,
            scale,
        )
        path = out_dir / f"assign_{i:03d}.png"
        cv2.imwrite(str(path), drawn)
        logger.info(
            f"{path}: {int((targets[i].sum(-1) > 0).sum())} GTs, {int(result.fg_mask[i].sum())} anchors"
        )


def main(argv=None) -> None:
    args = parse_with_overrides(make_parser(), argv)
    exp = build_exp(args)
    device = torch.device("cuda" if args.device == "gpu" else "cpu")
    model = exp.get_model().to(device)
    if args.ckpt:
        skipped = load_model_weights(model, model_state_dict(load_checkpoint(args.ckpt)))
        logger.info(f"loaded {args.ckpt}" + (f" ({len(skipped)} tensors skipped)" if skipped else ""))
    exp.prepare_dataset()
    loader = exp.get_data_loader(args.batch_size, is_distributed=False, no_aug=args.no_aug)
    imgs, targets, _, _ = next(iter(loader))
    imgs, targets = imgs.to(device).float(), targets.to(device)
    anchor_points, strides, result = assign_batch(model, imgs, targets)
    save_images(
        Path(args.output_dir),
        imgs,
        targets,
        anchor_points,
        strides,
        result,
        loader.dataset.class_names,
        args.scale,
    )
    logger.info(
        f"{result.num_fg} foreground anchors for {int((targets.sum(-1) > 0).sum())} GTs -> {args.output_dir}"
    )


if __name__ == "__main__":
    run_tool(main)
