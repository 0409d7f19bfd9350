"""SimOTA label assignment (YOLOX), batched over images and ground truths.

Semantics are those of the official YOLOX `get_assignments` / `simota_matching`, per image, in either of
its two rules:

- YOLOX 0.3.0's rule (`box_prior=True`, `center_radius=2.5`): an anchor is a candidate of a
  ground truth when its centre lies strictly inside the GT's box or inside the GT centre +- center_radius
  * stride, and in the GT's *window* (cost-free) when inside both; the out-of-window penalty is 1e5;
- the later YOLOX rule, the default (`box_prior=False`, `center_radius=1.5`): the window is the centre
  square alone (no in-box test), the penalty 1e6; it fine-tunes better on real photos (docs/results.md);
- either way the image's *candidates* are the union over its GTs, and
  cost[g, u] = cls_cost + iou_weight * -log(iou + 1e-8) + penalty * (u not in g's window), where cls_cost
  is the summed BCE of p = sqrt(sigmoid(cls) * sigmoid(obj)) against g's one-hot class, with torch's
  BCE conventions (log(p) and log1p(-p), each clamped at -100), in float32;
- dynamic_k[g] = max(1, int(sum of the top-min(topk, #candidates) IoUs of g over the candidates));
  g takes its dynamic_k lowest-cost candidates; an anchor taken by several GTs goes to the GT with the
  lowest cost over all of the image's valid GTs.

Two additions make it total: a candidate whose prediction is not finite (NaN/inf box, NaN logit) has
infinite cost and zero IoU and is never assigned (YOLOX crashes there), and an image without valid GTs
or without candidates gets no foreground. GTs with `gt_mask` False or a non-finite box are ignored.

`simota_assign` computes the same thing without a Python loop over images or GTs:
- the class cost is factorised, sum_c BCE(p_c, onehot(y)) = sum_c -log1p(-p_c) + (log1p(-p_y) - log p_y),
  so the class axis is only ever paired with candidates (N, U, C), never with GTs;
- windows are read off the anchor grid with `searchsorted` (<= 3x3 anchors per level for radius 1.5),
  and candidates are compacted per image to U = max candidates per image in the chunk;
- since every in-window cost is below the penalty and every out-of-window cost at least it, a GT with at
  least dynamic_k selectable window anchors picks among those only, and a conflict always goes to an
  in-window GT; only the rare GTs with fewer window anchors than dynamic_k get a full cost row;
- dynamic_k still uses the top IoUs over all of the image's candidates: the one (N, G, U) tensor;
- images are sorted by size and processed in chunks bounded by `max_bytes`, reusing buffers.
The window shortcut needs in-window costs below the penalty, i.e. fewer than ~10^3 classes with 0.3.0's
1e5, ~10^4 with 1e6 (checked).
The result equals the reference's except where two costs tie exactly or to within the rounding
difference of the factorised sum (ties are broken by topk/argmin, as in YOLOX, in either order).
`models/simota_reference.py` is the straightforward per-image loop it is tested and timed against.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import psutil
import torch
from loguru import logger

from yolox_fast.utils.boxes import bboxes_iou
from yolox_fast.utils.threads import single_threaded_on_cpu

__all__ = ["SimOTAResult", "simota_assign"]

IOU_EPS = 1e-8
BCE_LOG_CLAMP = -100.0
# Default working-set budget (see _chunk_budget): this fraction of the free GPU memory; on CPU,
# chunks of CPU_CHUNK_BYTES: small chunks whose buffers are reused stay in cache and avoid
# page-faulting fresh memory, measured fastest (4-8 MiB beat one whole-batch chunk by 2x at N=64).
DEFAULT_FREE_FRACTION = 0.25
CPU_CHUNK_BYTES = 8 * 2**20
# Chunks get this share of a budget after the resident tables: their estimate leaves out small temporaries
# and allocator slack (measured within 10%)
CHUNK_SHARE = 0.85


class SimOTAResult(NamedTuple):
    """Per-anchor assignment of a batch.

    fg_mask (N, A) bool; matched_gt (N, A) long, index into the G axis of the inputs (0 where not fg);
    matched_iou (N, A) float32, IoU of the prediction with its matched GT (0 where not fg);
    num_fg: number of foreground anchors in the batch.
    """

    fg_mask: torch.Tensor
    matched_gt: torch.Tensor
    matched_iou: torch.Tensor
    num_fg: int


# --------------------------------------------------------------------------- shared math
def _class_prob(cls: torch.Tensor, obj: torch.Tensor) -> torch.Tensor:
    """p = sqrt(sigmoid(cls) * sigmoid(obj)), YOLOX's joint score used in the class cost (in place on cls)."""
    return cls.sigmoid_().mul_(obj.sigmoid()).sqrt_()


def negative_bce_sum_(prob: torch.Tensor) -> torch.Tensor:
    """sum_c -max(log1p(-p_c), -100) over the last axis: the BCE of every class against target 0.

    prob (..., C) in [0, 1] -> (...,); prob is overwritten (it is the largest tensor of the assigner).
    """
    return prob.neg_().log1p_().clamp_(min=BCE_LOG_CLAMP).sum(-1).neg_()


def factorised_class_cost(p_at_class: torch.Tensor, neg_sum: torch.Tensor) -> torch.Tensor:
    """sum_c BCE(p_c, onehot(y)) from the per-candidate negative sum and the probability at class y.

    = sum_c -log1p(-p_c) - (-log1p(-p_y)) + (-log p_y), with torch's BCE conventions (log1p for the
    target-0 term, each log clamped at -100). p_at_class and neg_sum broadcast against each other.
    """
    pos = torch.log(p_at_class).clamp_(min=BCE_LOG_CLAMP).neg_()
    neg = torch.neg(p_at_class).log1p_().clamp_(min=BCE_LOG_CLAMP).neg_()
    return (neg_sum - neg) + pos


# YOLOX 0.3.0's rule as `simota_assign`'s keywords (the defaults are the later rule's)
RULE_0_3_0 = {"box_prior": True, "center_radius": 2.5}


def window_penalty(box_prior: bool) -> float:
    """What YOLOX adds to the cost outside a GT's window: 1e5 in 0.3.0 (box prior), 1e6 later. Any
    dominant value orders the costs alike; the exact one rounds them alike."""
    return 1e5 if box_prior else 1e6


def _prepare(pred_boxes, cls_logits, obj_logits, gt_boxes, gt_mask, iou_weight, penalty):
    """fp32 copies where needed, obj as (N, A), validity of GTs; checks the cost bound."""
    if obj_logits.dim() == 3:
        obj_logits = obj_logits[..., 0]
    num_classes = cls_logits.shape[-1]
    # The window shortcut relies on every in-window cost being below the penalty: each BCE term is <= 100.
    if 100.0 * num_classes + iou_weight * 18.5 >= penalty:
        raise ValueError(f"SimOTA's {penalty:g} window penalty is not dominant with {num_classes} classes")
    gt_boxes = gt_boxes.float()
    gt_valid = gt_mask.bool() & torch.isfinite(gt_boxes).all(-1)
    return pred_boxes.float(), obj_logits.float(), gt_boxes, gt_valid


def _check_classes(gt_classes: torch.Tensor, gt_valid: torch.Tensor, num_classes: int) -> None:
    bad = gt_valid & ((gt_classes < 0) | (gt_classes >= num_classes))
    if bool(bad.any()):
        raise ValueError(
            f"ground-truth class ids outside [0, {num_classes}): {gt_classes[bad].unique().tolist()}"
        )


# --------------------------------------------------------------------------- batched
class _Level(NamedTuple):
    offset: int  # first anchor index of the level
    xs: torch.Tensor  # (W,) increasing anchor centre x of each column
    ys: torch.Tensor  # (H,) increasing anchor centre y of each row
    center_dist: torch.Tensor  # (1,) fp32 stride * center_radius, computed like YOLOX


def _grid_levels(
    anchor_points: torch.Tensor, strides: torch.Tensor, center_radius: float
) -> list[_Level] | None:
    """The anchors as row-major grids, one per run of equal strides (YOLOX's layout), or None when they
    are not laid out that way (then windows are found by testing every anchor)."""
    num_anchors = strides.numel()
    starts = ((strides[1:] != strides[:-1]).nonzero()[:, 0] + 1).tolist()
    bounds = [0] + starts + [num_anchors]
    levels = []
    for lo, hi in itertools.pairwise(bounds):
        pts = anchor_points[lo:hi]
        width = int((pts[:, 1] == pts[0, 1]).int().cumprod(0).sum())
        if (hi - lo) % width:
            return None
        grid = pts.reshape((hi - lo) // width, width, 2)
        xs, ys = grid[0, :, 0], grid[:, 0, 1]
        if not (
            bool((grid[..., 0] == xs).all())
            and bool((grid[..., 1] == ys[:, None]).all())
            and bool((xs[1:] > xs[:-1]).all())
            and bool((ys[1:] > ys[:-1]).all())
        ):
            return None
        levels.append(_Level(lo, xs.contiguous(), ys.contiguous(), strides[lo : lo + 1] * center_radius))
    return levels


def _open_range(
    coords: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, end) indices of the sorted `coords` strictly inside (lo, hi), elementwise over lo/hi.

    x > fl(lo) and x < fl(hi) in fp32 is exactly YOLOX's `x - lo > 0` and `hi - x > 0` test.
    """
    first = torch.searchsorted(coords, lo.contiguous(), right=True)  # first coord > lo
    end = torch.searchsorted(coords, hi.contiguous())  # first coord >= hi
    return first, torch.maximum(end, first)


class _Rect(NamedTuple):
    """Cell rectangles of a level, [x0, x1) x [y0, y1), one per GT: (N, G) each."""

    x0: torch.Tensor
    x1: torch.Tensor
    y0: torch.Tensor
    y1: torch.Tensor


def _level_rects(level: _Level, gt_boxes: torch.Tensor, box_prior: bool) -> tuple[_Rect, _Rect | None]:
    """Each GT's centre window on the level and, with the box prior, the cells inside its box."""
    cx, cy, w, h = gt_boxes.unbind(-1)
    d = level.center_dist
    window = _Rect(*_open_range(level.xs, cx - d, cx + d), *_open_range(level.ys, cy - d, cy + d))
    if not box_prior:
        return window, None
    # YOLOX 0.3.0's box edges: cx - 0.5 * w etc., in fp32
    box = _Rect(
        *_open_range(level.xs, cx - 0.5 * w, cx + 0.5 * w), *_open_range(level.ys, cy - 0.5 * h, cy + 0.5 * h)
    )
    return window, box


def _rect_slots(level: _Level, rect: _Rect, valid: torch.Tensor, num_anchors: int) -> torch.Tensor:
    """Anchor ids (N, G, K) of each GT's rectangle (row-major); unused slots hold `num_anchors`."""
    device = rect.x0.device
    kx = int((rect.x1 - rect.x0).max()) if rect.x0.numel() else 0
    ky = int((rect.y1 - rect.y0).max()) if rect.y0.numel() else 0
    cols = rect.x0[..., None] + torch.arange(kx, device=device)  # (N, G, kx)
    rows = rect.y0[..., None] + torch.arange(ky, device=device)  # (N, G, ky)
    ok = (rows < rect.y1[..., None])[..., :, None] & (cols < rect.x1[..., None])[..., None, :]
    ids = level.offset + rows[..., :, None] * level.xs.numel() + cols[..., None, :]  # (N, G, ky, kx)
    return torch.where(ok & valid[..., None, None], ids, num_anchors).flatten(2)


def _rect_union(rects: list[_Rect], valid: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(N, height * width) bool: cells inside any valid GT's rectangle of `rects`, without an (N, G, A)
    tensor: +1/-1 at each rectangle's corners of a difference grid, then two prefix sums."""
    n = valid.shape[0]
    diff = torch.zeros(n, height + 1, width + 1, dtype=torch.int32, device=valid.device)
    flat = diff.view(-1)
    image = torch.arange(n, device=valid.device)[:, None].expand_as(valid)
    for r in rects:
        keep = valid & (r.x1 > r.x0) & (r.y1 > r.y0)
        base = image[keep] * (height + 1) * (width + 1)
        x0, x1, y0, y1 = r.x0[keep], r.x1[keep], r.y0[keep], r.y1[keep]
        for y, x, sign in ((y0, x0, 1), (y0, x1, -1), (y1, x0, -1), (y1, x1, 1)):
            flat.index_put_(
                (base + y * (width + 1) + x,), torch.full_like(x, sign, dtype=torch.int32), accumulate=True
            )
    return (diff.cumsum(1).cumsum(2)[:, :height, :width] > 0).flatten(1)


def _windows_and_candidates_grid(
    levels: list[_Level], gt_boxes: torch.Tensor, valid: torch.Tensor, num_anchors: int, box_prior: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(window slots (N, G, K) anchor ids, num_anchors = unused; candidate mask (N, A) bool), from the grids.

    Window of a GT: its centre window, cut to the cells inside its box with the box prior. Candidates of
    an image: the union of its GTs' centre windows, and with the box prior of their boxes too.
    """
    slots, candidates = [], []
    for level in levels:
        window, box = _level_rects(level, gt_boxes, box_prior)
        cut = window if box is None else _Rect(
            torch.maximum(window.x0, box.x0), torch.minimum(window.x1, box.x1),
            torch.maximum(window.y0, box.y0), torch.minimum(window.y1, box.y1),
        )  # fmt: skip
        slots.append(_rect_slots(level, cut, valid, num_anchors))
        rects = [window] if box is None else [window, box]
        candidates.append(_rect_union(rects, valid, level.ys.numel(), level.xs.numel()))
    return torch.cat(slots, dim=2), torch.cat(candidates, dim=1)


def _windows_and_candidates_dense(
    anchor_points, strides, center_radius, gt_boxes, valid, box_prior: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """As `_windows_and_candidates_grid`, by testing every anchor (any anchor layout; (N, G, A) masks)."""
    num_anchors = strides.numel()
    dist = strides.float() * center_radius
    ax, ay = anchor_points[:, 0].float(), anchor_points[:, 1].float()
    cx, cy, w, h = (gt_boxes[..., i : i + 1] for i in range(4))
    in_window = (
        (ax - (cx - dist) > 0) & (ay - (cy - dist) > 0) & ((cx + dist) - ax > 0) & ((cy + dist) - ay > 0)
    )
    in_window &= valid[..., None]  # (N, G, A)
    candidates = in_window.any(1)
    if box_prior:
        in_box = (
            (ax - (cx - 0.5 * w) > 0)
            & (ay - (cy - 0.5 * h) > 0)
            & ((cx + 0.5 * w) - ax > 0)
            & ((cy + 0.5 * h) - ay > 0)
        ) & valid[..., None]
        candidates |= in_box.any(1)
        in_window &= in_box
    count = int(in_window.sum(-1).max()) if in_window.numel() else 0
    flags, ids = torch.sort(in_window.to(torch.uint8), dim=-1, descending=True, stable=True)
    return torch.where(flags[..., :count].bool(), ids[..., :count], num_anchors), candidates


def _compact(candidates: torch.Tensor, num_anchors: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Candidate mask (N, A) -> (cand (N, U) anchor ids in increasing order, num_anchors past each image's
    count; num_cand (N,); position (N, A) of each anchor in cand, meaningful where it is a candidate)."""
    n = candidates.shape[0]
    position = candidates.cumsum(1) - 1
    num_cand = candidates.sum(1)
    width = int(num_cand.max()) if n else 0
    cand = torch.full((n, width + 1), num_anchors, dtype=torch.long, device=candidates.device)
    anchors = torch.arange(num_anchors, device=candidates.device).expand(n, -1)
    cand.scatter_(1, torch.where(candidates, position, width), anchors)
    return cand[:, :width], num_cand, position


class _Workspace:
    """Flat fp32 buffers reused across chunks: touching freshly allocated memory is what costs on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, *shape: int) -> torch.Tensor:
        numel = 1
        for s in shape:
            numel *= s
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=torch.float32, device=self.device)
            self.buffers[name] = buf
        return buf[:numel].view(shape)


def _chunk_bytes(images: int, num_cand: int, num_gt: int, num_slots: int, num_classes: int) -> int:
    """Working-set estimate of one chunk: class probs (n, U, C), three (n, G, U) IoU buffers, slot tensors."""
    return images * (
        4 * num_cand * num_classes + 12 * num_gt * num_cand + 64 * num_gt * num_slots + 96 * num_cand
    )


def _plan_chunks(
    num_cand: list[int], num_gt: list[int], num_slots: int, num_classes: int, max_bytes: int
) -> list[tuple[int, int]]:
    """Consecutive ranges [(start, end)] of the (size-sorted) images whose padded working set fits
    max_bytes; a range holds at least one image."""
    chunks, start, width, gts = [], 0, 0, 0
    for i, (u, g) in enumerate(zip(num_cand, num_gt)):
        w, h = max(width, u), max(gts, g)
        if i > start and _chunk_bytes(i + 1 - start, w, h, num_slots, num_classes) > max_bytes:
            chunks.append((start, i))
            start, w, h = i, u, g
        width, gts = w, h
    if num_cand:
        chunks.append((start, len(num_cand)))
    return chunks


def _chunk_budget(max_bytes: int | None, device: torch.device, resident: int) -> int:
    """Bytes a chunk's working set may take.

    A memory budget (max_bytes, or a quarter of the free GPU memory) first pays for what lives through
    all chunks (`resident`); chunks get 85% of the rest, since their estimate leaves out small
    temporaries and allocator slack (measured within 10%). The CPU default is about speed instead:
    chunks of CPU_CHUNK_BYTES (or a quarter of the available memory, if less).
    """
    if max_bytes is None and device.type != "cuda":
        return min(int(psutil.virtual_memory().available * DEFAULT_FREE_FRACTION), CPU_CHUNK_BYTES)
    if max_bytes is None:
        max_bytes = int(torch.cuda.mem_get_info(device)[0] * DEFAULT_FREE_FRACTION)
    return int(CHUNK_SHARE * max(max_bytes - resident, 0))


def _warn_below_floor(max_bytes: int | None, resident: int, largest_image: int) -> None:
    """Say so when `max_bytes` cannot hold: a chunk holds at least one image, so the call needs the
    resident tables plus the largest image's working set (`largest_image` B, estimated) at the least."""
    floor = resident + math.ceil(largest_image / CHUNK_SHARE)
    if max_bytes is not None and max_bytes < floor:
        logger.warning(
            f"SimOTA: max_bytes={max_bytes} is below this batch's floor of {floor} B (its tables and its "
            f"largest image's working set): the largest images are assigned one at a time, in up to "
            f"about {floor} B"
        )


@torch.no_grad()
def simota_assign(
    pred_boxes: torch.Tensor,
    cls_logits: torch.Tensor,
    obj_logits: torch.Tensor,
    anchor_points: torch.Tensor,
    strides: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_classes: torch.Tensor,
    gt_mask: torch.Tensor,
    *,
    center_radius: float = 1.5,
    box_prior: bool = False,
    topk: int = 10,
    iou_weight: float = 3.0,
    max_bytes: int | None = None,
) -> SimOTAResult:
    """SimOTA for a whole batch at once (see the module docstring for the exact semantics).

    The defaults are the later YOLOX rule (no box prior, centre radius 1.5); `box_prior=True,
    center_radius=2.5` is YOLOX 0.3.0's.

    pred_boxes (N, A, 4) cx, cy, w, h px; cls_logits (N, A, C); obj_logits (N, A) or (N, A, 1), any float
    dtype (computed in fp32, also under autocast); anchor_points (A, 2) anchor centres px; strides (A,);
    gt_boxes (N, G, 4) cx, cy, w, h px; gt_classes (N, G) long; gt_mask (N, G) bool, False for padding.
    max_bytes bounds the extra memory of the call by splitting the batch into chunks of similar-sized
    images (default on CUDA: a quarter of the free memory; on CPU: 8 MiB chunks, fastest there). On
    CUDA an out-of-memory error retries with smaller chunks, on the GPU. On CPU the ops run on one
    thread (see utils.threads.single_threaded_on_cpu).
    Returns SimOTAResult(fg_mask (N, A) bool, matched_gt (N, A) long, matched_iou (N, A) float, num_fg).
    """
    device = pred_boxes.device
    with torch.autocast(device.type, enabled=False), single_threaded_on_cpu(device):
        penalty = window_penalty(box_prior)
        pred_boxes, obj_logits, gt_boxes, gt_valid = _prepare(
            pred_boxes, cls_logits, obj_logits, gt_boxes, gt_mask, iou_weight, penalty
        )
        num_images, num_anchors, num_classes = cls_logits.shape
        _check_classes(gt_classes, gt_valid, num_classes)
        fg_mask = torch.zeros(num_images, num_anchors + 1, dtype=torch.bool, device=device)
        matched_gt = torch.zeros(num_images, num_anchors + 1, dtype=torch.long, device=device)
        matched_iou = torch.zeros(num_images, num_anchors + 1, dtype=torch.float32, device=device)

        # Valid GTs first (stable, so original order is kept), padding trimmed to the batch's max.
        gt_order = torch.sort((~gt_valid).to(torch.uint8), dim=1, stable=True).indices
        num_gt = gt_valid.sum(1)
        width = int(num_gt.max()) if num_images else 0
        if width == 0 or num_anchors == 0:
            return SimOTAResult(fg_mask[:, :-1], matched_gt[:, :-1], matched_iou[:, :-1], 0)
        gt_order = gt_order[:, :width]
        gt_valid = torch.gather(gt_valid, 1, gt_order)
        # Invalid GTs become zero boxes: IoU 0 with everything, and they own no window slot.
        gt_boxes = torch.gather(gt_boxes, 1, gt_order[..., None].expand(-1, -1, 4)).masked_fill_(
            ~gt_valid[..., None], 0
        )
        gt_classes = torch.gather(gt_classes.long(), 1, gt_order) * gt_valid

        levels = _grid_levels(anchor_points.float(), strides.float(), center_radius)
        if levels is not None:
            slots, candidates = _windows_and_candidates_grid(
                levels, gt_boxes, gt_valid, num_anchors, box_prior
            )
        else:
            slots, candidates = _windows_and_candidates_dense(
                anchor_points, strides, center_radius, gt_boxes, gt_valid, box_prior
            )
        cand, num_cand, position = _compact(candidates, num_anchors)
        slot_pos = torch.gather(position, 1, slots.clamp(max=num_anchors - 1).flatten(1)).view_as(slots)
        del candidates, position

        # Images with work, sorted by size so that a chunk pads little (G and U are per-chunk maxima).
        busy = ((num_gt > 0) & (num_cand > 0)).nonzero()[:, 0]
        key = num_gt[busy] * (int(num_cand.max()) + 1) + num_cand[busy]
        order = busy[torch.argsort(key, stable=True)]
        sizes_u, sizes_g = num_cand[order].tolist(), num_gt[order].tolist()
        # Outputs, window/candidate tables and the (N, A) position map they were made with.
        resident = fg_mask.numel() * 21 + 4 * slots.numel() * 8
        budget = _chunk_budget(max_bytes, device, resident)
        chunks = _plan_chunks(sizes_u, sizes_g, slots.shape[2], num_classes, budget)
        per_image = [_chunk_bytes(1, u, g, slots.shape[2], num_classes) for u, g in zip(sizes_u, sizes_g)]
        _warn_below_floor(max_bytes, resident, max(per_image, default=0))
        tables = _BatchTables(
            pred_boxes,
            cls_logits,
            obj_logits,
            gt_boxes,
            gt_classes,
            gt_valid,
            gt_order,
            slots,
            slot_pos,
            cand,
            penalty,
        )
        outputs = _Outputs(fg_mask, matched_gt, matched_iou)
        workspace = _Workspace(device)
        while chunks:
            start, end = chunks[0]
            u_max, g_max = max(sizes_u[start:end]), max(sizes_g[start:end])
            try:
                _assign_chunk(order[start:end], u_max, g_max, tables, outputs, workspace, topk, iou_weight)
            except torch.cuda.OutOfMemoryError:
                if device.type != "cuda" or end - start == 1:
                    raise
                del workspace
                torch.cuda.empty_cache()
                budget = _chunk_bytes((end - start) // 2, u_max, g_max, slots.shape[2], num_classes)
                logger.warning(
                    f"SimOTA: out of GPU memory on {end - start} images, retrying in chunks of <= {budget} B"
                )
                workspace = _Workspace(device)
                rest = _plan_chunks(sizes_u[start:], sizes_g[start:], slots.shape[2], num_classes, budget)
                chunks = [(s + start, e + start) for s, e in rest]
                continue
            chunks.pop(0)
        fg_mask, matched_gt, matched_iou = fg_mask[:, :-1], matched_gt[:, :-1], matched_iou[:, :-1]
        return SimOTAResult(fg_mask, matched_gt, matched_iou, int(fg_mask.sum()))


class _BatchTables(NamedTuple):
    """What every chunk reads: the batch's fp32 predictions and its window/candidate tables."""

    pred_boxes: torch.Tensor  # (N, A, 4) cx, cy, w, h px
    cls_logits: torch.Tensor  # (N, A, C), any float dtype
    obj_logits: torch.Tensor  # (N, A)
    gt_boxes: torch.Tensor  # (N, G, 4) cx, cy, w, h px: valid GTs first, invalid ones zeroed
    gt_classes: torch.Tensor  # (N, G) long
    gt_valid: torch.Tensor  # (N, G) bool
    gt_order: torch.Tensor  # (N, G) index of each (sorted) GT in the caller's G axis
    slots: torch.Tensor  # (N, G, K) anchor ids of each GT's window; num_anchors = unused slot
    slot_pos: torch.Tensor  # (N, G, K) position of each slot's anchor among the image's candidates
    cand: torch.Tensor  # (N, U) candidate anchor ids, num_anchors past each image's count
    penalty: float  # added to the cost outside a GT's window


class _Outputs(NamedTuple):
    """The assignment being written, (N, A + 1) each: the last column is a dump for padding."""

    fg_mask: torch.Tensor  # bool
    matched_gt: torch.Tensor  # long
    matched_iou: torch.Tensor  # float32


class _Chunk(NamedTuple):
    """n images of the batch, padded to U candidates and G GTs (the chunk's maxima)."""

    images: torch.Tensor  # (n,) indices into the batch
    cand: torch.Tensor  # (n, U) anchor ids, num_anchors past each image's count
    gt_classes: torch.Tensor  # (n, G)
    gt_valid: torch.Tensor  # (n, G)
    slot_ok: torch.Tensor  # (n, G, K) the slot holds an anchor
    slot_pos: torch.Tensor  # (n, G, K) candidate position of each slot (0 where unused)
    prob: torch.Tensor  # (n, U, C) sqrt(sigmoid(cls) * sigmoid(obj)), in a reused buffer
    bad: torch.Tensor  # (n, U) unusable candidate: padding or a non-finite prediction
    ious: torch.Tensor  # (n, G, U) IoU of each GT with each candidate's predicted box
    dynamic_k: torch.Tensor  # (n, G)


def _assign_chunk(
    images: torch.Tensor,
    u_max: int,
    g_max: int,
    tables: _BatchTables,
    outputs: _Outputs,
    ws: _Workspace,
    topk: int,
    iou_weight: float,
) -> None:
    """Assign the images with indices `images` (n,) whose largest has u_max candidates and g_max GTs,
    and write their rows of `outputs`."""
    chunk = _gather_chunk(images, u_max, g_max, tables, ws, topk)
    slot_cost, slot_bad, picks, neg_sum = _pick_anchors(chunk, topk, iou_weight, tables.penalty)
    owner, fg = _resolve_conflicts(chunk, tables, picks, slot_cost, slot_bad, neg_sum, iou_weight)

    num_anchors = tables.cls_logits.shape[1]
    owner_iou = torch.gather(chunk.ious, 1, owner[:, None, :]).squeeze(1)  # (n, U)
    # Non-fg positions write into each row's dump column.
    out_index = (images[:, None] * (num_anchors + 1) + torch.where(fg, chunk.cand, num_anchors)).flatten()
    outputs.fg_mask.view(-1).index_put_((out_index,), fg.flatten())
    outputs.matched_gt.view(-1).index_put_(
        (out_index,), torch.gather(tables.gt_order[images], 1, owner).flatten()
    )
    outputs.matched_iou.view(-1).index_put_((out_index,), owner_iou.flatten())


def _gather_chunk(
    images: torch.Tensor, u_max: int, g_max: int, t: _BatchTables, ws: _Workspace, topk: int
) -> _Chunk:
    """The chunk's candidates with their class probabilities, boxes, IoUs with each GT and dynamic k."""
    (num_images, num_anchors, num_classes), n = t.cls_logits.shape, images.numel()
    cand = t.cand[images, :u_max]
    cand_ok = cand < num_anchors
    # Row of each candidate in the (N * A, ...) flattened predictions; padding reads anchor 0.
    rows = (images[:, None] * num_anchors + cand.masked_fill(~cand_ok, 0)).flatten()
    slot_ok = t.slots[images, :g_max] < num_anchors

    # Class probabilities of the candidates (n, U, C), fp32 in a reused buffer.
    prob = ws.get("prob", n, u_max, num_classes)
    cls_flat = t.cls_logits.reshape(num_images * num_anchors, num_classes)
    if cls_flat.dtype == torch.float32:
        torch.index_select(cls_flat, 0, rows, out=prob.view(n * u_max, num_classes))
    else:
        prob.view(n * u_max, num_classes).copy_(cls_flat.index_select(0, rows))
    obj = t.obj_logits.reshape(-1).index_select(0, rows).view(n, u_max, 1)
    _class_prob(prob, obj)
    boxes = t.pred_boxes.reshape(-1, 4).index_select(0, rows).view(n, u_max, 4)
    # Unusable candidates: padding, NaN class/objectness (p is NaN; it is in [0, 1] otherwise), bad box.
    bad = ~cand_ok | torch.isnan(prob.sum(-1)) | ~torch.isfinite(boxes).all(-1)
    boxes.masked_fill_(bad[..., None], 0.0)  # zero boxes: IoU 0 with every GT

    iou_buffers = (
        ws.get("iou0", n, g_max, u_max),
        ws.get("iou1", n, g_max, u_max),
        ws.get("iou2", n, g_max, u_max),
    )
    ious = bboxes_iou(t.gt_boxes[images, :g_max], boxes, xyxy=False, buffers=iou_buffers)
    dynamic_k = torch.topk(ious, min(topk, u_max), dim=2).values.sum(2).int().clamp_(min=1)
    return _Chunk(
        images,
        cand,
        t.gt_classes[images, :g_max],
        t.gt_valid[images, :g_max],
        slot_ok,
        t.slot_pos[images, :g_max].masked_fill(~slot_ok, 0),
        prob,
        bad,
        ious,
        dynamic_k,
    )


class _Picks(NamedTuple):
    """(image, GT, candidate position) of every anchor some GT picked, (P,) each."""

    img: torch.Tensor
    gt: torch.Tensor
    pos: torch.Tensor


def _pick_anchors(
    c: _Chunk, topk: int, iou_weight: float, penalty: float
) -> tuple[torch.Tensor, torch.Tensor, _Picks, torch.Tensor]:
    """Each GT's dynamic_k cheapest candidates. Returns the window slots' costs (n, G, K) (inf where
    unusable), which slots are unusable, the picks, and each candidate's target-0 BCE sum (n, U)."""
    n, g_max, u_max = c.ious.shape
    num_classes = c.prob.shape[2]
    device = c.ious.device
    inf = float("inf")

    # Window slots: IoU and p at the GT's class, gathered before prob becomes log terms.
    slot_bad = ~c.slot_ok | torch.gather(c.bad, 1, c.slot_pos.flatten(1)).view_as(c.slot_ok)
    slot_iou = torch.gather(
        c.ious.flatten(1), 1, (c.slot_pos + torch.arange(g_max, device=device)[:, None] * u_max).flatten(1)
    ).view_as(c.slot_pos)
    prob_flat = c.prob.view(n, u_max * num_classes)
    slot_p = torch.gather(
        prob_flat, 1, (c.slot_pos * num_classes + c.gt_classes[..., None]).flatten(1)
    ).view_as(c.slot_pos)
    # GTs with fewer selectable window anchors than dynamic_k need their full cost row (rare).
    window_count = (~slot_bad).sum(2)
    full_row = c.gt_valid & (window_count < c.dynamic_k)  # (n, G)
    row_img, row_gt = full_row.nonzero(as_tuple=True)
    row_p = c.prob[row_img, :, c.gt_classes[row_img, row_gt]]  # (R, U)

    # prob -> per-candidate sum of the target-0 BCE terms (in place).
    neg_sum = negative_bce_sum_(c.prob)  # (n, U)

    def pair_cost(p_at_class, cand_neg_sum, iou):
        return factorised_class_cost(p_at_class, cand_neg_sum) + iou_weight * -torch.log(iou + IOU_EPS)

    slot_neg_sum = torch.gather(neg_sum, 1, c.slot_pos.flatten(1)).view_as(c.slot_pos)
    slot_cost = pair_cost(slot_p, slot_neg_sum, slot_iou).masked_fill_(slot_bad, inf)  # (n, G, K)

    # Picks inside windows: the dynamic_k cheapest slots of each GT that has enough of them.
    k_slots = min(topk, slot_cost.shape[2])
    _, pick_slot = torch.topk(slot_cost, k_slots, dim=2, largest=False)
    rank = torch.arange(k_slots, device=device)
    pick_ok = (rank < c.dynamic_k[..., None]) & ~full_row[..., None] & c.gt_valid[..., None]  # (n, G, k)
    pick_img = torch.arange(n, device=device)[:, None, None].expand_as(pick_slot)[pick_ok]
    pick_gt = torch.arange(g_max, device=device)[None, :, None].expand_as(pick_slot)[pick_ok]
    pick_pos = torch.gather(c.slot_pos, 2, pick_slot)[pick_ok]

    if row_img.numel():
        # Full rows: every candidate, out-of-window ones at + penalty (YOLOX's geometry constraint).
        in_window = torch.zeros(row_img.numel(), u_max + 1, dtype=torch.bool, device=device)
        in_window.scatter_(
            1, torch.where(c.slot_ok[row_img, row_gt], c.slot_pos[row_img, row_gt], u_max), True
        )
        row_cost = pair_cost(row_p, neg_sum[row_img], c.ious[row_img, row_gt])
        row_cost += penalty * ~in_window[:, :u_max]
        row_cost.masked_fill_(c.bad[row_img], inf)  # (R, U)
        k_rows = min(topk, u_max)
        row_pick_cost, row_pick = torch.topk(row_cost, k_rows, dim=1, largest=False)
        row_ok = (
            torch.arange(k_rows, device=device) < c.dynamic_k[row_img, row_gt][:, None]
        ) & torch.isfinite(row_pick_cost)
        pick_img = torch.cat([pick_img, row_img[:, None].expand_as(row_pick)[row_ok]])
        pick_gt = torch.cat([pick_gt, row_gt[:, None].expand_as(row_pick)[row_ok]])
        pick_pos = torch.cat([pick_pos, row_pick[row_ok]])
    return slot_cost, slot_bad, _Picks(pick_img, pick_gt, pick_pos), neg_sum


def _resolve_conflicts(
    c: _Chunk,
    t: _BatchTables,
    picks: _Picks,
    slot_cost: torch.Tensor,
    slot_bad: torch.Tensor,
    neg_sum: torch.Tensor,
    iou_weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(owner GT (n, U), foreground (n, U)) of every candidate.

    An anchor taken more than once goes to the lowest-cost GT over all valid GTs; ties go to the lowest
    GT index, as torch.min does. When some GT's window holds the anchor, that is a window GT (in-window
    costs < penalty <= out-of-window ones), found among the window slots. With the box prior an anchor
    can be a candidate in nobody's window; the rare such conflicts get their full cost column.
    """
    n, g_max, u_max = c.ious.shape
    device = c.ious.device
    flat_pick = picks.img * u_max + picks.pos
    takers = torch.zeros(n * u_max, dtype=torch.long, device=device).index_add_(
        0, flat_pick, torch.ones_like(flat_pick)
    )
    single_owner = torch.zeros(n * u_max, dtype=torch.long, device=device).index_put_((flat_pick,), picks.gt)
    slot_flat = (torch.arange(n, device=device)[:, None, None] * u_max + c.slot_pos).flatten()
    slot_cost_flat = slot_cost.flatten()
    best_cost = torch.full((n * u_max,), float("inf"), device=device).scatter_reduce_(
        0, slot_flat, slot_cost_flat, "amin"
    )
    slot_gt = torch.arange(g_max, device=device)[None, :, None].expand_as(c.slot_pos).flatten()
    is_best = (slot_cost_flat == best_cost[slot_flat]) & ~slot_bad.flatten()
    best_gt = torch.full((n * u_max,), g_max, dtype=torch.long, device=device).scatter_reduce_(
        0, slot_flat[is_best], slot_gt[is_best], "amin"
    )
    windowless = ((takers > 1) & ~torch.isfinite(best_cost)).nonzero()[:, 0]
    if windowless.numel():
        best_gt[windowless] = _cheapest_gt(c, t, windowless, neg_sum, iou_weight)
    owner = torch.where(takers > 1, best_gt, single_owner).view(n, u_max).clamp_(max=g_max - 1)
    return owner, (takers > 0).view(n, u_max)


def _cheapest_gt(
    c: _Chunk, t: _BatchTables, flat: torch.Tensor, neg_sum: torch.Tensor, iou_weight: float
) -> torch.Tensor:
    """Index of the lowest-cost valid GT (R,) for the candidates at flat positions `flat` (R,) of the chunk.

    The class probabilities were turned into log terms in place, so p at each GT's class is computed
    again from the logits, with the same elementwise arithmetic.
    """
    num_images, num_anchors, num_classes = t.cls_logits.shape
    u_max = c.ious.shape[2]
    img, pos = flat // u_max, flat % u_max
    rows = c.images[img] * num_anchors + c.cand[img, pos]  # (R,) rows of the flattened predictions
    logits = t.cls_logits.reshape(-1, num_classes)[rows].float()  # (R, C)
    p = _class_prob(
        torch.gather(logits, 1, c.gt_classes[img]), t.obj_logits.reshape(-1)[rows, None]
    )  # (R, G)
    iou = c.ious[img, :, pos]  # (R, G)
    cost = factorised_class_cost(p, neg_sum[img, pos, None]) + iou_weight * -torch.log(iou + IOU_EPS)
    cost = (cost + t.penalty).masked_fill_(~c.gt_valid[img], float("inf"))
    return cost.argmin(1)
