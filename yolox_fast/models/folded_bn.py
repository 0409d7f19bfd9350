"""Weights whose BatchNorm was folded into the convolutions, made fit for training again.

A checkpoint rebuilt from an inference export (ONNX, TensorRT, a fused model) keeps BatchNorm layers whose
running statistics are the identity (mean 0, var 1 - eps, weight 1): the layers' true scale and shift live
in the conv weights and the BN bias. In eval mode that computes the exported function exactly. In train
mode it does not: BatchNorm then normalises every channel by its batch statistics, to unit variance around
the folded bias, and the start of fine-tuning is far from the weights' function (a COCO-trained nano
fine-tuned so starts near AP 0 on a new set, as if from scratch).

`refit_folded_bn` measures each BatchNorm's input statistics on real images (mean mu, variance var per
channel) and makes them the running statistics, with weight and bias chosen so that each layer's eval-mode
map y = a * x + c stays exactly what it was (for identity statistics: weight = sqrt(var + eps), bias += mu).
Train-mode outputs, normalised by batch statistics close to mu and var, then start at that map too.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from loguru import logger
from torch import nn


def batchnorms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [
        m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]


@torch.no_grad()
def has_folded_bn(model: nn.Module, tol: float = 1e-6) -> bool:
    """True when every BatchNorm of `model` carries identity statistics (mean 0, var 1 - eps or 1,
    weight 1): its scale and shift were folded into the convolutions."""
    layers = batchnorms(model)
    if not layers:
        return False
    for bn in layers:
        var = bn.running_var
        identity_var = torch.isclose(var, torch.full_like(var, 1 - bn.eps), atol=tol) | torch.isclose(
            var, torch.ones_like(var), atol=tol
        )
        if not (bn.running_mean.abs().max() <= tol and identity_var.all()):
            return False
        if bn.affine and not torch.allclose(bn.weight, torch.ones_like(bn.weight), atol=tol):
            return False
    return True


@torch.no_grad()
def refit_folded_bn(model: nn.Module, batches: Iterable[torch.Tensor]) -> int:
    """Re-estimate every BatchNorm's statistics from the images `batches` ((B, 3, H, W) float tensors on
    the model's device) so that train mode starts at the model's eval-mode function (module docstring).

    The model's eval-mode outputs are unchanged; its train/eval mode is restored. Returns the number of
    images seen. Statistics are accumulated in float64 over all batches (per channel: count, sum, sum of
    squares of each BatchNorm's input).
    """
    layers = batchnorms(model)
    sums: dict[nn.Module, list[torch.Tensor]] = {}

    def record(module, inputs, _output):
        x = inputs[0].detach().double()
        dims = [d for d in range(x.dim()) if d != 1]
        count = x.numel() / x.shape[1]
        acc = sums.setdefault(module, [torch.zeros((), dtype=torch.float64), 0.0, 0.0])
        acc[0] = acc[0] + count
        acc[1] = acc[1] + x.sum(dims)
        acc[2] = acc[2] + (x * x).sum(dims)

    hooks = [bn.register_forward_hook(record) for bn in layers]
    training = model.training
    model.eval()
    seen = 0
    try:
        for images in batches:
            model(images)
            seen += images.shape[0]
    finally:
        for h in hooks:
            h.remove()
        model.train(training)
    if seen == 0:
        return 0
    for bn in layers:
        if bn not in sums:  # a layer the forward pass does not reach
            continue
        count, total, squares = sums[bn]
        mean = total / count
        var = (squares / count - mean * mean).clamp_min(0)
        # the layer's eval-mode map per channel, y = a * x + c, kept exactly under the new statistics
        weight = bn.weight.double() if bn.affine else torch.ones_like(mean)
        bias = bn.bias.double() if bn.affine else torch.zeros_like(mean)
        a = weight / torch.sqrt(bn.running_var.double() + bn.eps)
        c = bias - a * bn.running_mean.double()
        bn.running_mean.copy_(mean)
        bn.running_var.copy_(var)
        if bn.affine:
            bn.weight.copy_(a * torch.sqrt(var + bn.eps))
            bn.bias.copy_(c + a * mean)
    return seen


def refit_on_images(
    model: nn.Module,
    dataset,
    device: torch.device,
    memory_format: torch.memory_format = torch.contiguous_format,
    count: int = 128,
    batch: int = 8,
) -> int:
    """`refit_folded_bn` on `count` images of a DetectionDataset, spread evenly over it and letterboxed as
    for evaluation (`dataset[i][0]`), in batches of `batch`; returns the number of images seen."""
    indices = np.unique(np.linspace(0, len(dataset) - 1, min(count, len(dataset))).round().astype(int))
    images = torch.from_numpy(np.stack([dataset[int(i)][0] for i in indices]))
    return refit_folded_bn(
        model, (b.to(device).contiguous(memory_format=memory_format) for b in images.split(batch))
    )


def refit_finetune_weights(
    model: nn.Module, dataset, device: torch.device, memory_format, source: str
) -> None:
    """`refit_on_images` for the trainer's -c weights (`source`), saying why in the log."""
    seen = refit_on_images(model, dataset, device, memory_format)
    logger.info(
        f"{source}: its BatchNorm layers carry identity statistics (folded into the convolutions, as in "
        f"weights rebuilt from an ONNX export); re-estimated them on {seen} training images so that training "
        "starts from these weights' function (refit_folded_bn False keeps them)"
    )
