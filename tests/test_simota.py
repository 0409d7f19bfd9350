"""Batched SimOTA: equal to the per-image reference, robust, exact under chunking and autocast."""

import json
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import load_tool
from torchvision.ops import box_convert, box_iou

from benchmarks.kit.inputs import anchor_grid, make_inputs
from yolox_fast.models.simota import RULE_0_3_0, factorised_class_cost, negative_bce_sum_, simota_assign
from yolox_fast.models.simota_reference import simota_assign_reference
from yolox_fast.utils.boxes import bboxes_iou


def random_case(seed: int, num_images: int = 4, size: int = 96, num_classes: int = 5, max_gt: int = 12):
    """A batch with the awkward cases mixed in: images without GTs, tiny and huge boxes, boxes centred
    on or beyond the border, duplicated GTs (identical costs, shared anchors), GTs in a cluster."""
    gen = torch.Generator().manual_seed(seed)
    points, strides = anchor_grid(size)
    num_anchors = points.shape[0]
    counts = torch.randint(0, max_gt + 1, (num_images,), generator=gen)
    counts[0] = 0 if seed % 5 == 0 else counts[0]
    gt_mask = torch.arange(max_gt)[None] < counts[:, None]
    centre = torch.rand(num_images, max_gt, 2, generator=gen) * size * 1.2 - 0.1 * size
    log_wh = torch.empty(num_images, max_gt, 2).uniform_(math.log(1.0), math.log(size * 1.5), generator=gen)
    wh = log_wh.exp()
    kind = torch.randint(0, 6, (num_images, max_gt), generator=gen)
    centre[kind == 1] = 0.0  # on the top-left corner
    centre[..., 0][kind == 2] = float(size)  # on the right border
    wh[kind == 3] = 2.0  # tiny
    cluster = kind == 4  # all near the image centre: many GTs share anchors
    centre[cluster] = size / 2 + torch.randn(int(cluster.sum()), 2, generator=gen) * 4
    gt_boxes = torch.cat([centre, wh], -1)
    gt_classes = torch.randint(0, num_classes, (num_images, max_gt), generator=gen)
    dup = (kind == 5) & (torch.arange(max_gt) > 0)
    gt_boxes[dup] = gt_boxes.roll(1, dims=1)[dup]
    gt_classes[dup] = gt_classes.roll(1, dims=1)[dup]
    gt_boxes = gt_boxes * gt_mask[..., None]
    gt_classes = gt_classes * gt_mask

    jitter = torch.randn(num_images, num_anchors, 4, generator=gen)
    pred_xy = points + jitter[..., :2] * strides[:, None]
    pred_wh = strides[:, None] * torch.exp(1.0 + jitter[..., 2:])
    cls_logits = torch.randn(num_images, num_anchors, num_classes, generator=gen) * 2 - 3
    obj_logits = torch.randn(num_images, num_anchors, 1, generator=gen) * 2 - 2
    return {
        "pred_boxes": torch.cat([pred_xy, pred_wh], -1),
        "cls_logits": cls_logits,
        "obj_logits": obj_logits,
        "anchor_points": points,
        "strides": strides,
        "gt_boxes": gt_boxes,
        "gt_classes": gt_classes,
        "gt_mask": gt_mask,
    }


# YOLOX 0.3.0's rule (the default) and the later one: both must equal the per-image reference exactly
RULES = {
    "yolox_0.3.0": {"center_radius": 2.5, "box_prior": True},
    "later_yolox": {"center_radius": 1.5, "box_prior": False},
}
rules = pytest.mark.parametrize("rule", list(RULES.values()), ids=list(RULES))


def assignments_differ(a, b):
    """(N, A) bool: anchors where fg or (for fg anchors) the matched GT differ."""
    return (a.fg_mask != b.fg_mask) | (a.fg_mask & (a.matched_gt != b.matched_gt))


@rules
def test_matches_reference_on_random_batches(rule):
    differing = total = 0
    fg_total = 0
    for seed in range(60):
        batch = random_case(seed, size=(64, 96, 128)[seed % 3])
        ref = simota_assign_reference(**batch, **rule)
        fast = simota_assign(**batch, **rule)
        diff = assignments_differ(ref, fast)
        differing += int(diff.sum())
        total += diff.numel()
        fg_total += ref.num_fg
        both = ref.fg_mask & fast.fg_mask
        assert torch.equal(ref.matched_iou[both & ~diff], fast.matched_iou[both & ~diff])
    assert fg_total > 1000  # the cases do exercise the assigner
    # Differences may only come from near-ties broken in another summation order; none occur here.
    assert differing / total <= 1e-3
    assert differing == 0


@rules
def test_matches_reference_at_416_px_80_classes(rule):
    batch = make_inputs(6, 416, 80, seed=3)
    ref = simota_assign_reference(**batch, **rule)
    fast = simota_assign(**batch, **rule)
    assert ref.num_fg > 100
    assert fast.num_fg == ref.num_fg
    assert not assignments_differ(ref, fast).any()
    assert torch.equal(ref.matched_iou, fast.matched_iou)


@rules
def test_anchor_layout_without_grids_gives_same_assignment(rule):
    # Permuted anchors are not row-major grids: windows are then found by testing every anchor.
    batch = random_case(7, num_images=3)
    perm = torch.randperm(batch["strides"].numel(), generator=torch.Generator().manual_seed(0))
    shuffled = dict(batch)
    for key in ("pred_boxes", "cls_logits", "obj_logits"):
        shuffled[key] = batch[key][:, perm]
    shuffled["anchor_points"], shuffled["strides"] = batch["anchor_points"][perm], batch["strides"][perm]
    base = simota_assign(**batch, **rule)
    moved = simota_assign(**shuffled, **rule)
    assert moved.num_fg == base.num_fg > 0
    assert torch.equal(moved.fg_mask, base.fg_mask[:, perm])
    assert torch.equal(moved.matched_gt[moved.fg_mask], base.matched_gt[:, perm][moved.fg_mask])


def test_class_cost_factorisation_equals_explicit_bce_float64():
    gen = torch.Generator().manual_seed(0)
    prob = torch.rand(7, 50, 6, generator=gen, dtype=torch.float64)  # (U, C) per image
    prob[0, :3, 0] = 0.0  # log clamps at -100
    prob[0, 3:6, 1] = 1.0
    prob[1, :5] = 1e-45
    classes = torch.randint(0, 6, (7, 9), generator=gen)  # (N, G)
    onehot = F.one_hot(classes, 6).double()
    explicit = F.binary_cross_entropy(
        prob[:, None].expand(-1, 9, -1, -1), onehot[:, :, None].expand(-1, -1, 50, -1), reduction="none"
    ).sum(-1)  # (N, G, U)
    p_at_class = torch.gather(prob, 2, classes[:, None, :].expand(-1, 50, -1)).transpose(1, 2)  # (N, G, U)
    factorised = factorised_class_cost(p_at_class, negative_bce_sum_(prob.clone())[:, None, :])
    torch.testing.assert_close(factorised, explicit, rtol=1e-12, atol=1e-10)


def test_pairwise_iou_agrees_with_torchvision():
    gen = torch.Generator().manual_seed(1)
    a = torch.cat([torch.rand(2, 6, 2, generator=gen) * 50, torch.rand(2, 6, 2, generator=gen) * 30 + 1], -1)
    b = torch.cat([torch.rand(2, 9, 2, generator=gen) * 50, torch.rand(2, 9, 2, generator=gen) * 30 + 1], -1)
    ours = bboxes_iou(a, b, xyxy=False)
    for i in range(2):
        expected = box_iou(box_convert(a[i], "cxcywh", "xyxy"), box_convert(b[i], "cxcywh", "xyxy"))
        torch.testing.assert_close(ours[i], expected)


@rules
def test_chunked_equals_unchunked_exactly(rule):
    batch = random_case(11, num_images=7, size=128, max_gt=20)
    whole = simota_assign(**batch, max_bytes=2**40, **rule)
    for max_bytes in (1, 20_000, 200_000):
        chunked = simota_assign(**batch, max_bytes=max_bytes, **rule)
        assert torch.equal(chunked.fg_mask, whole.fg_mask)
        assert torch.equal(chunked.matched_gt, whole.matched_gt)
        assert torch.equal(chunked.matched_iou, whole.matched_iou)


def peak_cpu_bytes(fn) -> int:
    """The most bytes torch's CPU allocator held at once, over what it held before, while `fn()` ran:
    every allocation and free in order, from torch.profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    held = peak = 0
    for _, nbytes in sorted((e["ts"], e["args"]["Bytes"]) for e in events if e.get("name") == "[memory]"):
        held += nbytes
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize(
    "num_images, size, max_bytes",
    [(16, 320, 4 * 2**20), (16, 320, 8 * 2**20), (8, 640, 8 * 2**20), (8, 640, 5 * 2**20)],
)
def test_peak_memory_stays_within_max_bytes(num_images, size, max_bytes, log_lines, monkeypatch):
    """The bound itself: the peak of what simota_assign allocates (its tables, chunks and temporaries, as the
    allocator sees them) stays within max_bytes, and every chunk the planner makes is estimated within the
    chunk budget. A budget below the batch's floor (a chunk holds one image at least) says so, with the
    floor, and the peak stays within that floor instead (8 images at 640 px, 5 MiB)."""
    from yolox_fast.models import simota

    planned: list[tuple[int, list[int]]] = []
    plan = simota._plan_chunks

    def recording_plan(num_cand, num_gt, num_slots, num_classes, budget):
        chunks = plan(num_cand, num_gt, num_slots, num_classes, budget)
        sizes = [
            simota._chunk_bytes(e - s, max(num_cand[s:e]), max(num_gt[s:e]), num_slots, num_classes)
            for s, e in chunks
        ]
        planned.append((budget, [n for (s, e), n in zip(chunks, sizes) if e - s > 1]))
        return chunks

    monkeypatch.setattr(simota, "_plan_chunks", recording_plan)
    # 0.3.0's rule: its larger candidate sets make these batches outgrow these budgets; the planner and
    # the chunking are the same code for the later rule
    batch = {**make_inputs(num_images, size, seed=0), **RULE_0_3_0}
    whole = simota_assign(**batch, max_bytes=2**40)
    peak = peak_cpu_bytes(lambda: simota_assign(**batch, max_bytes=max_bytes))
    (budget, multi_image_chunks), *_ = planned[1:]
    assert budget < max_bytes and all(n <= budget for n in multi_image_chunks)
    floors = [int(m[1]) for m in (re.search(r"floor of (\d+) B", line) for line in log_lines) if m]
    assert peak <= max([max_bytes, *floors]), (peak, max_bytes, floors)
    assert bool(floors) == ((num_images, size, max_bytes) == (8, 640, 5 * 2**20))
    assert peak_cpu_bytes(lambda: simota_assign(**batch, max_bytes=2**40)) > 1.5 * max_bytes  # unchunked
    assert torch.equal(simota_assign(**batch, max_bytes=max_bytes).fg_mask, whole.fg_mask)


def test_hand_checked_tiny_case():
    # One 16 px level of 4x4 anchors (centres 8, 24, 40, 56), one GT of class 1 at (24, 24) 16x16.
    points, strides = anchor_grid(64)
    keep = strides == 16
    points, strides = points[keep], strides[keep]
    num_anchors = points.shape[0]
    pred = torch.cat([points, torch.full((num_anchors, 2), 16.0)], -1)[None]
    cls = torch.full((1, num_anchors, 2), -6.0)
    obj = torch.full((1, num_anchors, 1), -6.0)
    gt = torch.tensor([[[24.0, 24.0, 16.0, 16.0]]])
    rule = RULES["later_yolox"]
    out = simota_assign(
        pred, cls, obj, points, strides, gt, torch.tensor([[1]]), torch.tensor([[True]]), **rule
    )
    # Window (0, 48) per axis holds centres 8, 24, 40: anchors 0-2, 4-6, 8-10. Anchor 5 at (24, 24)
    # predicts the GT exactly (IoU 1); its neighbours' boxes only touch it (IoU 0), so the top IoUs sum
    # to 1, dynamic_k = 1, and the lowest cost (equal class costs, IoU cost 0 vs 3 * 18.4) is anchor 5.
    assert out.num_fg == 1
    assert out.fg_mask[0].nonzero().flatten().tolist() == [5]
    assert out.matched_gt[0, 5] == 0
    assert out.matched_iou[0, 5] == 1.0
    ref = simota_assign_reference(
        pred, cls, obj, points, strides, gt, torch.tensor([[1]]), torch.tensor([[True]]), **rule
    )
    assert torch.equal(ref.fg_mask, out.fg_mask)
    # 0.3.0's rule: the cost-free window is the box (16, 32) x (16, 32) AND the centre window: anchor 5
    # alone; the other candidates are the centre window's. Same pick: it alone has IoU > 0.
    out = simota_assign(pred, cls, obj, points, strides, gt, torch.tensor([[1]]), torch.tensor([[True]]))
    assert out.fg_mask[0].nonzero().flatten().tolist() == [5]


@rules
def test_conflicts_resolved_like_reference(rule):
    # Two same-class GTs around the image centre share their window anchors; predictions are jittered
    # so that no costs tie exactly.
    gen = torch.Generator().manual_seed(0)
    points, strides = anchor_grid(64)
    num_anchors = points.shape[0]
    pred = torch.cat(
        [
            points + torch.randn(num_anchors, 2, generator=gen),
            20.0 * torch.exp(0.2 * torch.randn(num_anchors, 2, generator=gen)),
        ],
        -1,
    )[None]
    cls = torch.randn(1, num_anchors, 1, generator=gen) - 2.0
    obj = torch.randn(1, num_anchors, 1, generator=gen)
    gt = torch.tensor([[[32.0, 32.0, 20.0, 20.0], [33.0, 34.0, 22.0, 20.0]]])
    classes = torch.zeros(1, 2, dtype=torch.long)
    alone = [
        simota_assign(pred, cls, obj, points, strides, gt, classes, torch.tensor([[i == 0, i == 1]]), **rule)
        for i in range(2)
    ]
    shared = alone[0].fg_mask & alone[1].fg_mask
    assert shared.any()  # both GTs pick these anchors: a conflict to resolve
    both = torch.ones(1, 2, dtype=torch.bool)
    out = simota_assign(pred, cls, obj, points, strides, gt, classes, both, **rule)
    ref = simota_assign_reference(pred, cls, obj, points, strides, gt, classes, both, **rule)
    assert torch.equal(out.fg_mask, ref.fg_mask) and torch.equal(out.matched_gt, ref.matched_gt)
    assert out.fg_mask[shared].all()


def test_conflicts_over_anchors_in_nobodys_window_go_to_the_cheapest_gt(monkeypatch):
    """0.3.0's rule: tiny GTs have (almost) no anchor inside both their box and centre window, so they
    pick by full cost rows among candidates of nobody's window; two of them claiming the same anchor
    are resolved by the full cost column, as YOLOX's torch.min over all GTs."""
    from yolox_fast.models import simota

    calls = []
    real = simota._cheapest_gt
    monkeypatch.setattr(simota, "_cheapest_gt", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(4)
    points, strides = anchor_grid(96)
    num_anchors = points.shape[0]
    # two same-class 4 px GTs between anchor centres (no anchor inside either box), every prediction a
    # ~4 px box near them: both GTs take their cheapest candidates by full rows, and share some
    jitter = torch.randn(num_anchors, 4, generator=gen)
    pred = torch.cat([40 + 1.5 * jitter[:, :2], 4.0 * torch.exp(0.1 * jitter[:, 2:])], -1)
    cls = torch.randn(1, num_anchors, 2, generator=gen)
    obj = torch.randn(1, num_anchors, 1, generator=gen)
    gt = torch.tensor([[[40.0, 40.0, 4.0, 4.0], [41.0, 40.5, 4.0, 3.0]]])
    classes, both = torch.tensor([[0, 0]]), torch.ones(1, 2, dtype=torch.bool)
    out = simota_assign(pred[None], cls, obj, points, strides, gt, classes, both, **RULE_0_3_0)
    ref = simota_assign_reference(pred[None], cls, obj, points, strides, gt, classes, both, **RULE_0_3_0)
    assert calls, "the case must exercise conflicts outside every window"
    assert out.num_fg == ref.num_fg > 2
    assert torch.equal(out.fg_mask, ref.fg_mask) and torch.equal(out.matched_gt, ref.matched_gt)


def test_padding_gts_never_own_anchors_and_order_is_kept():
    batch = random_case(3, num_images=2, max_gt=8)
    batch["gt_mask"][:, 0] = False  # padding at the front, real boxes behind it
    batch["gt_boxes"][:, 0] = torch.tensor([40.0, 40.0, 30.0, 30.0])  # padding row with a plausible box
    out = simota_assign(**batch)
    ref = simota_assign_reference(**batch)
    assert not (out.fg_mask & (out.matched_gt == 0)).any()
    assert torch.equal(out.fg_mask, ref.fg_mask) and torch.equal(out.matched_gt, ref.matched_gt)


def test_nan_inf_predictions_and_degenerate_gts_are_safe():
    batch = random_case(4, num_images=3, max_gt=10)
    batch["gt_mask"][:] = True
    batch["pred_boxes"][0, ::3] = float("nan")
    batch["pred_boxes"][1, ::5, 2] = float("inf")
    batch["cls_logits"][1, ::4, 0] = float("nan")
    batch["cls_logits"][2, ::2] = float("inf")
    batch["obj_logits"][2, 1::2] = float("-inf")
    batch["obj_logits"][0, 1::7] = float("nan")
    batch["gt_boxes"][0, 0, 2:] = 0.0  # zero-size GT
    batch["gt_boxes"][1, 1] = torch.tensor([-500.0, -500.0, 10.0, 10.0])  # far outside: no window anchor
    batch["gt_boxes"][2, 2] = float("nan")  # ignored
    out = simota_assign(**batch)
    ref = simota_assign_reference(**batch)
    for res in (out, ref):
        assert torch.isfinite(res.matched_iou).all()
        bad = ~torch.isfinite(batch["pred_boxes"]).all(-1) | torch.isnan(batch["cls_logits"]).any(-1)
        bad |= torch.isnan(batch["obj_logits"][..., 0])
        assert not (res.fg_mask & bad).any()
        assert not (res.fg_mask[2] & (res.matched_gt[2] == 2)).any()
    assert out.num_fg > 0
    assert torch.equal(out.fg_mask, ref.fg_mask) and torch.equal(out.matched_gt, ref.matched_gt)


def test_all_padding_and_empty_inputs():
    batch = random_case(5, num_images=2)
    batch["gt_mask"][:] = False
    for fn in (simota_assign, simota_assign_reference):
        out = fn(**batch)
        assert out.num_fg == 0 and not out.fg_mask.any()
        assert out.fg_mask.shape == batch["pred_boxes"].shape[:2]
    zero_gt = dict(
        batch,
        gt_boxes=batch["gt_boxes"][:, :0],
        gt_classes=batch["gt_classes"][:, :0],
        gt_mask=batch["gt_mask"][:, :0],
    )
    assert simota_assign(**zero_gt).num_fg == 0
    all_nan = random_case(6, num_images=2)
    all_nan["pred_boxes"][:] = float("nan")
    out = simota_assign(**all_nan)
    assert out.num_fg == 0 and torch.isfinite(out.matched_iou).all()


def test_bf16_autocast_equals_fp32():
    batch = random_case(8, num_images=3, max_gt=10)
    fp32 = simota_assign(**batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = simota_assign(**batch)
    assert torch.equal(under_autocast.fg_mask, fp32.fg_mask)
    assert torch.equal(under_autocast.matched_gt, fp32.matched_gt)
    assert under_autocast.matched_iou.dtype == torch.float32
    # bf16 inputs are upcast: same result as their fp32 values
    low = {
        k: (v.bfloat16() if k in ("pred_boxes", "cls_logits", "obj_logits") else v) for k, v in batch.items()
    }
    upcast = {k: (v.float() if v.dtype == torch.bfloat16 else v) for k, v in low.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = simota_assign(**low)
    b = simota_assign(**upcast)
    assert torch.equal(a.fg_mask, b.fg_mask) and torch.equal(a.matched_gt, b.matched_gt)


def test_rejects_out_of_range_classes():
    batch = random_case(9, num_images=1, max_gt=4)
    batch["gt_mask"][:] = True
    batch["gt_classes"][0, 0] = 99
    with pytest.raises(ValueError, match="class ids"):
        simota_assign(**batch)


def test_visualize_tool_assigns_in_train_mode_and_draws_in_gt_colours():
    from yolox_fast.models import YOLOPAFPN, YOLOX, YOLOXHead

    tool = load_tool("visualize_assign")
    torch.manual_seed(0)
    model = YOLOX(YOLOPAFPN(0.33, 0.25, depthwise=True), YOLOXHead(3, 0.25, depthwise=True))
    imgs = torch.rand(2, 3, 64, 64) * 255
    targets = torch.zeros(2, 4, 5)
    targets[0, :2] = torch.tensor([[0, 20, 20, 16, 16], [2, 44, 40, 20, 30]])
    targets[1, 0] = torch.tensor([1, 32, 32, 40, 24])
    real_loss = model.head.loss_fn
    points, strides, result = tool.assign_batch(model, imgs, targets)
    assert model.head.loss_fn is real_loss  # the capture is undone
    assert model.training
    assert result.fg_mask.shape == (2, points.shape[0])
    assert result.num_fg >= 3  # every GT gets at least one anchor
    drawn = tool.draw_assignment(
        np.zeros((64, 64, 3), np.uint8),
        targets[0].numpy(),
        points.numpy(),
        strides.numpy(),
        result.fg_mask[0].numpy(),
        result.matched_gt[0].numpy(),
        ["a", "b", "c"],
        scale=2.0,
    )
    assert drawn.shape == (128, 128, 3)
    for a in result.fg_mask[0].nonzero().flatten().tolist():
        x, y = (points[a] * 2).round().long().tolist()
        assert tuple(drawn[y, x]) == tool.gt_color(int(result.matched_gt[0, a]))
