"""Building blocks of YOLOX: conv-BN-act, depthwise conv, CSP bottlenecks, SPP and the Focus stem.

Attribute names (conv, bn, dconv, pconv, conv1..conv3, m, layer1/2) are those of official YOLOX, so
the state_dict keys of every model built from these blocks match official checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

ACTIVATIONS = ("silu", "relu", "lrelu")


class SiLU(nn.SiLU):
    """nn.SiLU that, with `inplace`, works in place only where autograd will not need its input.

    SiLU's backward reads its input x. Run in place while autograd records, torch first saves a copy of x:
    one more full pass over every activation, about 5% of a CPU training step. Out of place, the x it
    keeps is the BatchNorm output that already exists, for the same memory. Where nothing is recorded
    (eval, export, no_grad), in place saves allocating the output.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        recorded = torch.is_grad_enabled() and x.requires_grad
        return F.silu(x, inplace=self.inplace and not recorded)


def get_activation(name: str = "silu", inplace: bool = True) -> nn.Module:
    """The activation module called `name`: "silu", "relu" or "lrelu" (LeakyReLU, slope 0.1, as YOLOX).

    ReLU and LeakyReLU backward read their output, so in place costs them nothing under autograd."""
    if name == "silu":
        return SiLU(inplace=inplace)
    if name == "relu":
        return nn.ReLU(inplace=inplace)
    if name == "lrelu":
        return nn.LeakyReLU(0.1, inplace=inplace)
    raise ValueError(f"unsupported activation {name!r}; choose one of {', '.join(ACTIVATIONS)}")


class BaseConv(nn.Module):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> activation. (N, Cin, H, W) -> (N, Cout, H/s, W/s).

    `fuse_model` folds `bn` into `conv` and replaces it by an identity.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        ksize: int,
        stride: int,
        groups: int = 1,
        bias: bool = False,
        act: str = "silu",
    ) -> None:
        super().__init__()
        pad = (ksize - 1) // 2
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size=ksize, stride=stride, padding=pad, groups=groups, bias=bias
        )
        self.bn: nn.Module = nn.BatchNorm2d(out_channels)
        self.act = get_activation(act, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class DWConv(nn.Module):
    """Depthwise-separable conv: a ksize depthwise BaseConv then a 1x1 pointwise BaseConv."""

    def __init__(self, in_channels: int, out_channels: int, ksize: int, stride: int = 1, act: str = "silu"):
        super().__init__()
        self.dconv = BaseConv(in_channels, in_channels, ksize, stride, groups=in_channels, act=act)
        self.pconv = BaseConv(in_channels, out_channels, 1, 1, groups=1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pconv(self.dconv(x))


class Bottleneck(nn.Module):
    """1x1 reduce then 3x3 conv, with a residual add when `shortcut` and the channel counts agree."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        shortcut: bool = True,
        expansion: float = 0.5,
        depthwise: bool = False,
        act: str = "silu",
    ) -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        conv = DWConv if depthwise else BaseConv
        self.conv1 = BaseConv(in_channels, hidden, 1, 1, act=act)
        self.conv2 = conv(hidden, out_channels, 3, 1, act=act)
        self.use_add = shortcut and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(self.conv1(x))
        return y + x if self.use_add else y


class SPPBottleneck(nn.Module):
    """Spatial pyramid pooling (YOLOv3-SPP): concat of stride-1 max pools of several sizes, then 1x1."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_sizes: Sequence[int] = (5, 9, 13),
        activation: str = "silu",
    ) -> None:
        super().__init__()
        hidden = in_channels // 2
        self.conv1 = BaseConv(in_channels, hidden, 1, 1, act=activation)
        self.m = nn.ModuleList([nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2) for k in kernel_sizes])
        self.conv2 = BaseConv(hidden * (len(kernel_sizes) + 1), out_channels, 1, 1, act=activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = torch.cat([x] + [pool(x) for pool in self.m], dim=1)
        return self.conv2(x)


class CSPLayer(nn.Module):
    """C3 block of CSPNet: two 1x1 branches, `n` bottlenecks on the first, concat, 1x1 fuse."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        n: int = 1,
        shortcut: bool = True,
        expansion: float = 0.5,
        depthwise: bool = False,
        act: str = "silu",
    ) -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.conv1 = BaseConv(in_channels, hidden, 1, 1, act=act)
        self.conv2 = BaseConv(in_channels, hidden, 1, 1, act=act)
        self.conv3 = BaseConv(2 * hidden, out_channels, 1, 1, act=act)
        self.m = nn.Sequential(
            *[Bottleneck(hidden, hidden, shortcut, 1.0, depthwise, act=act) for _ in range(n)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.m(self.conv1(x))
        x2 = self.conv2(x)
        return self.conv3(torch.cat((x1, x2), dim=1))


def space_to_depth(x: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, 4C, H/2, W/2): the four pixel phases stacked in YOLOX's order (top-left,
    bottom-left, top-right, bottom-right; channel (2 * dw + dh) * C + c holds pixel (2i + dh, 2j + dw))."""
    return torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), dim=1)


def space_to_depth_kernel(weight: torch.Tensor) -> torch.Tensor:
    """(O, 4C, k, k) -> (O, C, 2k, 2k): the kernel that, with twice the stride and the padding, computes on
    an image what `weight` computes on its `space_to_depth`: tap (t, u) of phase (dh, dw) reads the pixel at
    offset (2t + dh, 2u + dw)."""
    out_c, phases_c, k, _ = weight.shape
    c = phases_c // 4
    w = weight.reshape(out_c, 2, 2, c, k, k)  # (O, dw, dh, C, t, u)
    return w.permute(0, 3, 4, 2, 5, 1).reshape(out_c, c, 2 * k, 2 * k)  # (O, C, t, dh, u, dw)


class Focus(nn.Module):
    """Space-to-depth stem: (N, C, H, W) -> (N, 4C, H/2, W/2) -> BaseConv, YOLOX's layers and weights.

    The conv's weights keep their space-to-depth shape (official checkpoints load as they are), but the
    stem runs as the equal convolution of the image itself (`space_to_depth_kernel`, stride and padding
    doubled): the same sums without the interleaving copy of the four phases. On a 2-core CPU the stem runs
    1.5x faster in inference and 1.3x in training, the whole model's inference 1.05x (`python
    tools/benchmark.py stem`); outputs differ by float rounding only.
    """

    def __init__(
        self, in_channels: int, out_channels: int, ksize: int = 1, stride: int = 1, act: str = "silu"
    ):
        super().__init__()
        self.conv = BaseConv(in_channels * 4, out_channels, ksize, stride, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv.conv
        nhwc = x.is_contiguous(memory_format=torch.channels_last)
        layout = torch.channels_last if nhwc else torch.contiguous_format
        weight = space_to_depth_kernel(conv.weight).contiguous(memory_format=layout)
        stride = tuple(2 * s for s in conv.stride)
        padding = tuple(2 * p for p in conv.padding)
        return self.conv.act(self.conv.bn(F.conv2d(x, weight, conv.bias, stride, padding)))


@contextmanager
def _frozen_bn_stats(module: nn.Module) -> Iterator[None]:
    """Restore BatchNorm running statistics after the block runs.

    Checkpointing recomputes a block's forward during backward; in training mode that second pass
    would update running_mean/var and num_batches_tracked a second time.
    """
    saved = [
        (buf, buf.clone())
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        for buf in (m.running_mean, m.running_var, m.num_batches_tracked)
        if buf is not None
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


def run_block(module: nn.Module, x: torch.Tensor, grad_checkpointing: bool) -> torch.Tensor:
    """`module(x)`, through activation checkpointing when asked and useful (training with grad enabled)."""
    if grad_checkpointing and module.training and torch.is_grad_enabled():
        return checkpoint(
            module, x, use_reentrant=False, context_fn=lambda: (nullcontext(), _frozen_bn_stats(module))
        )
    return module(x)


def fuse_conv_and_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A Conv2d (with bias) computing bn(conv(x)) with the BN's running statistics (eval semantics)."""
    fused = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        kernel_size=conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
        bias=True,
    ).to(device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        # computed in fp32 (or wider) so half models do not lose precision in 1/sqrt(var)
        work = torch.promote_types(conv.weight.dtype, torch.float32)
        scale = bn.weight.to(work) / torch.sqrt(bn.running_var.to(work) + bn.eps)  # (Cout,)
        fused.weight.copy_((conv.weight.to(work) * scale[:, None, None, None]).to(conv.weight.dtype))
        conv_bias = conv.bias.to(work) if conv.bias is not None else torch.zeros_like(scale)
        bias = (conv_bias - bn.running_mean.to(work)) * scale + bn.bias.to(work)
        fused.bias.copy_(bias.to(conv.weight.dtype))
    fused.requires_grad_(conv.weight.requires_grad)
    return fused


def fuse_model(model: nn.Module) -> nn.Module:
    """Fold every BaseConv's BatchNorm into its conv (in place) for faster inference; returns `model`.

    Only for inference: the folded BN no longer adapts to batch statistics in training mode.
    """
    for m in model.modules():
        if isinstance(m, BaseConv) and isinstance(m.bn, nn.BatchNorm2d):
            m.conv = fuse_conv_and_bn(m.conv, m.bn)
            m.bn = nn.Identity()
    return model
