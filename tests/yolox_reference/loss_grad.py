"""(a) Loss and gradients on the same batch, same weights: official YOLOX 0.3.0 nano vs yolox_fast nano,
as it trains ("ours": its batched SimOTA with 0.3.0's rule), the same with the stem computed as official
writes it ("ours_phases_stem": phases stacked, then the conv, instead of `models.Focus`'s one strided conv of
the image: the same sums rounded alike, so that the rest is compared op for op) and with the later YOLOX
SimOTA rule ("ours_later_rule": simota_box_prior False, simota_center_radius 1.5).

Also: whether both build the same initial weights under the same torch seed, and whether
`exp.get_optimizer` puts the same parameters into the same SGD groups with the same settings.

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/loss_grad.py
"""

from __future__ import annotations

import copy
import dataclasses

import common
import torch

from benchmarks.suites.ab import with_phases_stem

NUM_CLASSES = 4
SIZE = (160, 224)  # (H, W): non-square, so a transposed grid would show


def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """4 images (0-255) and targets (4, 30, 5) [cls, cx, cy, w, h] px: 0, 1, 9 and 25 boxes, among them
    a 2 x 3 px box, boxes touching the border and two boxes sharing a centre."""
    h, w = SIZE
    imgs = torch.rand(4, 3, h, w, generator=gen) * 255
    targets = torch.zeros(4, 30, 5)
    targets[1, 0] = torch.tensor([2, 100.0, 80.0, 40.0, 30.0])
    for i, n in ((2, 9), (3, 25)):
        wh = torch.empty(n, 2).uniform_(4, 90, generator=gen)
        centre = torch.rand(n, 2, generator=gen) * (torch.tensor([w, h]) - wh) + wh / 2
        targets[i, :n, 0] = torch.randint(0, NUM_CLASSES, (n,), generator=gen).float()
        targets[i, :n, 1:3] = centre
        targets[i, :n, 3:5] = wh
    targets[2, 0, 1:] = torch.tensor([30.0, 40.0, 2.0, 3.0])  # tiny
    targets[2, 1, 1:] = torch.tensor([8.0, 80.0, 16.0, 50.0])  # touches the left border
    targets[2, 2, 1:] = torch.tensor([112.0, 80.0, 30.0, 30.0])  # same centre as the next one
    targets[2, 3, 1:] = torch.tensor([112.0, 80.0, 60.0, 20.0])
    return imgs, targets


def loss_and_grads(model, imgs, targets, use_l1: bool) -> tuple[dict, dict]:
    model.train()
    model.head.use_l1 = use_l1
    model.zero_grad(set_to_none=True)
    out = model(imgs.clone(), targets.clone())
    out["total_loss"].backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: float(v) for k, v in out.items()}, grads


def compare(official: tuple[dict, dict], other: tuple[dict, dict]) -> dict:
    """How far `other`'s (losses, grads) are from official's."""
    (loss_off, grads_off), (loss, grads) = official, other
    loss_rel = {k: abs(loss[k] - v) / max(abs(v), 1e-12) for k, v in loss_off.items()}
    per_tensor = {n: common.relative(grads[n], g) for n, g in grads_off.items()}
    worst = max(per_tensor, key=per_tensor.get)
    flat_off = torch.cat([g.flatten() for g in grads_off.values()])
    flat = torch.cat([grads[n].flatten() for n in grads_off])
    return {
        "losses": loss,
        "loss_max_rel_diff": max(loss_rel.values()),
        "same_grad_tensors": sorted(grads_off) == sorted(grads),
        "grad_max_rel_diff": per_tensor[worst],
        "grad_worst_tensor": worst,
        "grad_global_rel_diff": common.relative(flat, flat_off),
    }


def compare_step(models: dict, imgs, targets, use_l1: bool) -> dict:
    runs = {name: loss_and_grads(m, imgs, targets, use_l1) for name, m in models.items()}
    return {
        "official_losses": runs["official"][0],
        "num_grad_tensors": len(runs["official"][1]),
        **{name: compare(runs["official"], run) for name, run in runs.items() if name != "official"},
    }


def optimizer_groups(exp, model) -> list[dict]:
    names = {id(p): n for n, p in model.named_parameters()}
    exp.model = model
    optimizer = exp.get_optimizer(64)
    return [
        {
            "params": sorted(names[id(p)] for p in g["params"]),
            **{k: g[k] for k in ("lr", "momentum", "weight_decay", "nesterov", "dampening")},
        }
        for g in optimizer.param_groups
    ]


def collect(argv: list[str] | None = None) -> dict:
    official_exp = common.official_nano_exp(NUM_CLASSES)
    ours_exp = common.ours_nano_exp(NUM_CLASSES)
    torch.manual_seed(0)
    official = official_exp.get_model()
    torch.manual_seed(0)
    ours = ours_exp.get_model()
    off_sd, ours_sd = official.state_dict(), ours.state_dict()
    same_keys = list(off_sd) == list(ours_sd)
    init_max_abs_diff = max(
        float((off_sd[k].double() - ours_sd[k].double()).abs().max()) if off_sd[k].numel() else 0.0
        for k in off_sd
    )
    ours.load_state_dict(official.state_dict())
    ours_later = copy.deepcopy(ours)  # the later YOLOX SimOTA rule, an exp switch here
    ours_later.head.loss_fn = dataclasses.replace(ours_later.head.loss_fn, box_prior=False, center_radius=1.5)
    models = {"official": official, "ours": ours, "ours_phases_stem": with_phases_stem(ours),
              "ours_later_rule": ours_later}  # fmt: skip

    imgs, targets = batch(torch.Generator().manual_seed(0))
    steps = {
        "no_l1": compare_step(models, imgs, targets, use_l1=False),
        "l1": compare_step(models, imgs, targets, use_l1=True),
    }
    groups_official = optimizer_groups(official_exp, official)
    groups_ours = optimizer_groups(ours_exp, ours)
    return {
        "state_dict_same_keys_in_order": same_keys,
        "init_same_seed_max_abs_diff": init_max_abs_diff,
        "steps": steps,
        "optimizer_groups_equal": groups_official == groups_ours,
        "optimizer_group_sizes": [len(g["params"]) for g in groups_official],
        "optimizer_group_sizes_ours": [len(g["params"]) for g in groups_ours],
    }


if __name__ == "__main__":
    common.run(collect)
