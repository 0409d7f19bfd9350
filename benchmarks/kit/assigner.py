"""The assigner's table: batched `simota_assign` against the per-image reference and, where it is importable,
official YOLOX 0.3.0's own `get_assignments` loop, on the same training-shaped inputs (`inputs.make_inputs`):
seconds per call and the extra memory at the peak of one (the simota suite's table, and the gpu check's).
All three run YOLOX 0.3.0's rule (official's), so they compute the same assignments."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from loguru import logger

from benchmarks.kit.inputs import make_inputs
from benchmarks.kit.measure import CpuPeak, peak_bytes, timed
from yolox_fast.models.simota import RULE_0_3_0, simota_assign
from yolox_fast.models.simota_reference import simota_assign_reference

batched = partial(simota_assign, **RULE_0_3_0)
reference = partial(simota_assign_reference, **RULE_0_3_0)


def time_call(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Fastest of `repeats` calls after one warm-up call, in seconds: on a shared machine the noise is
    other processes' load, which only ever adds time."""
    fn()
    measure = timed(fn, device=device)
    return min(measure() for _ in range(repeats))


def official_assigner() -> Callable[..., object] | None:
    """YOLOX 0.3.0's assignment in `simota_assign`'s argument layout: its head's `get_assignments`, image by
    image as its `get_losses` calls it; None when official YOLOX is not importable (run with the
    reference python, tools/setup_yolox_reference.sh)."""
    try:
        from yolox.models.yolo_head import YOLOXHead as OfficialHead
    except ImportError:
        return None
    heads: dict[int, object] = {}

    def assign(pred_boxes, cls_logits, obj_logits, anchor_points, strides, gt_boxes, gt_classes, gt_mask):
        num_images, num_anchors, num_classes = cls_logits.shape
        if num_classes not in heads:
            heads[num_classes] = OfficialHead(num_classes, width=0.25).to(pred_boxes.device)
        head = heads[num_classes]
        x_shifts = (anchor_points[:, 0] / strides - 0.5)[None]  # cell indices, as official keeps them
        y_shifts = (anchor_points[:, 1] / strides - 0.5)[None]
        labels = torch.cat([gt_classes[..., None].float(), gt_boxes], -1) * gt_mask[..., None]
        for i in range(num_images):
            num_gt = int(gt_mask[i].sum())  # official reads the first num_gt rows
            if num_gt:
                gts, classes = gt_boxes[i, :num_gt], gt_classes[i, :num_gt].float()
                head.get_assignments(
                    i, num_gt, num_anchors, gts, classes, pred_boxes[i],
                    strides[None], x_shifts, y_shifts, cls_logits, pred_boxes, obj_logits, labels, None,
                )  # fmt: skip

    return assign


def mib(b: float) -> str:
    """Bytes as a MiB cell."""
    return f"{b / 2**20:.1f}"


def _slice(batch: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    shared = ("anchor_points", "strides")
    return {k: (v if k in shared else v[:n]) for k, v in batch.items()}


def run_table(
    sizes: Sequence[int],
    batch_sizes: Sequence[int],
    num_classes: int,
    device: torch.device,
    repeats: int,
    full: bool,
    est_images: int,
    max_bytes: int | None,
    amp_dtype: torch.dtype | None = None,
) -> list[list]:
    """One row per (size, N): seconds per call and peak memory of the batched assigner, the per-image
    reference and (when importable) official YOLOX 0.3.0, with the speed-ups against both."""
    official = official_assigner()
    per_image = {"reference": reference, **({"official": official} if official else {})}
    rows = []
    timed = {}

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None)

    def under_autocast(fn, **batch):
        def call():
            with autocast():
                fn(**batch)

        return call

    for size in sizes:
        batch_all = make_inputs(max(batch_sizes), size, num_classes, device=device)
        if amp_dtype is not None:  # the head's outputs under autocast: half-precision predictions
            for key in ("pred_boxes", "cls_logits", "obj_logits"):
                batch_all[key] = batch_all[key].to(amp_dtype)
        for n in batch_sizes:
            batch = _slice(batch_all, n)
            fast = time_call(under_autocast(partial(batched, max_bytes=max_bytes), **batch), device, repeats)
            estimate = device.type == "cpu" and n >= 256 and not full
            times = {"batched": fast}
            for name, fn in per_image.items():
                slow_repeats = max(2, repeats // 2)
                if estimate:
                    sub = _slice(batch_all, est_images)
                    times[name] = time_call(under_autocast(fn, **sub), device, slow_repeats) * n / est_images
                else:
                    times[name] = time_call(under_autocast(fn, **batch), device, slow_repeats)
            timed[(size, n)] = (times, estimate)
            logger.info(f"{size} px N={n}: " + ", ".join(f"{k} {v:.4f} s" for k, v in times.items()))
    cpu_peak = CpuPeak() if device.type == "cpu" else None
    for size in sizes:
        batch_all = make_inputs(max(batch_sizes), size, num_classes, device=device)
        for n in batch_sizes:
            batch = _slice(batch_all, n)
            times, estimate = timed[(size, n)]
            mem = {"batched": peak_bytes(partial(batched, **batch, max_bytes=max_bytes), device, cpu_peak)}
            for name, fn in per_image.items():
                mem[name] = peak_bytes(partial(fn, **batch), device, cpu_peak)  # one call, always
            tag = " (est.)" if estimate else ""
            row = [n, size, f"{times['reference']:.4f}{tag}"]
            row += [f"{times['official']:.4f}{tag}"] if official else []
            row += [f"{times['batched']:.4f}", f"{times['reference'] / times['batched']:.1f}x{tag}"]
            row += [f"{times['official'] / times['batched']:.1f}x{tag}"] if official else []
            row += [mib(mem["reference"])] + ([mib(mem["official"])] if official else [])
            row += [
                mib(mem["batched"]),
                f"{mem['batched'] / max(mem.get('official', mem['reference']), 1):.2f}",
            ]
            rows.append(row)
    return rows


def table_headers(with_official: bool) -> list[str]:
    official = with_official
    return (
        ["N", "size", "ref s/call"]
        + (["official s/call"] if official else [])
        + ["batched s/call", "vs ref"]
        + (["vs official"] if official else [])
        + ["ref peak MiB"]
        + (["official peak MiB"] if official else [])
        + ["batched peak MiB", "mem vs " + ("official" if official else "ref")]
    )
