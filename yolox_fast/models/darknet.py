"""Backbones: CSPDarknet (YOLOX, YOLOv5-style) and the classic Darknet-21/53 (YOLOv3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from yolox_fast.models.network_blocks import (
    BaseConv,
    CSPLayer,
    DWConv,
    Focus,
    ResLayer,
    SPPBottleneck,
    run_block,
)

STAGES = ("stem", "dark2", "dark3", "dark4", "dark5")
DARKNET_BLOCKS = {21: (1, 2, 2, 1), 53: (2, 8, 8, 4)}  # residual blocks in dark2..dark5


class _StagedBackbone(nn.Module):
    """The forward both backbones share: stem, dark2..dark5 in order; the `out_features` stages returned."""

    out_features: tuple[str, ...]
    grad_checkpointing: bool

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        outputs = {}
        for name in STAGES:
            x = run_block(getattr(self, name), x, self.grad_checkpointing)
            outputs[name] = x
        return {k: v for k, v in outputs.items() if k in self.out_features}


class CSPDarknet(_StagedBackbone):
    """CSPDarknet with a Focus stem and an SPP block in the last stage.

    forward: (N, 3, H, W) -> {name: feature} for `out_features`; dark3/dark4/dark5 have strides
    8/16/32 and int(256/512/1024 * wid_mul) channels. `dep_mul` scales the CSP block counts.
    """

    def __init__(
        self,
        dep_mul: float,
        wid_mul: float,
        out_features: Sequence[str] = ("dark3", "dark4", "dark5"),
        depthwise: bool = False,
        act: str = "silu",
    ) -> None:
        super().__init__()
        unknown = set(out_features) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown CSPDarknet out_features {sorted(unknown)}; stages are {STAGES}")
        self.out_features = tuple(out_features)
        self.grad_checkpointing = False
        conv = DWConv if depthwise else BaseConv

        base_channels = int(wid_mul * 64)  # 64 for width 1.0
        base_depth = max(round(dep_mul * 3), 1)  # 3 for depth 1.0

        self.stem = Focus(3, base_channels, ksize=3, act=act)
        self.dark2 = nn.Sequential(
            conv(base_channels, base_channels * 2, 3, 2, act=act),
            CSPLayer(base_channels * 2, base_channels * 2, n=base_depth, depthwise=depthwise, act=act),
        )
        self.dark3 = nn.Sequential(
            conv(base_channels * 2, base_channels * 4, 3, 2, act=act),
            CSPLayer(base_channels * 4, base_channels * 4, n=base_depth * 3, depthwise=depthwise, act=act),
        )
        self.dark4 = nn.Sequential(
            conv(base_channels * 4, base_channels * 8, 3, 2, act=act),
            CSPLayer(base_channels * 8, base_channels * 8, n=base_depth * 3, depthwise=depthwise, act=act),
        )
        self.dark5 = nn.Sequential(
            conv(base_channels * 8, base_channels * 16, 3, 2, act=act),
            SPPBottleneck(base_channels * 16, base_channels * 16, activation=act),
            CSPLayer(
                base_channels * 16,
                base_channels * 16,
                n=base_depth,
                shortcut=False,
                depthwise=depthwise,
                act=act,
            ),
        )


class Darknet(_StagedBackbone):
    """Darknet-21 or Darknet-53 (YOLOv3 backbone, LeakyReLU, residual stages, SPP head block).

    forward: (N, 3, H, W) -> {name: feature}; dark3/dark4/dark5 have strides 8/16/32 and
    256/512/512 channels for stem_out_channels=32.
    """

    def __init__(
        self,
        depth: int = 53,
        in_channels: int = 3,
        stem_out_channels: int = 32,
        out_features: Sequence[str] = ("dark3", "dark4", "dark5"),
    ) -> None:
        super().__init__()
        if depth not in DARKNET_BLOCKS:
            raise ValueError(f"Darknet depth must be one of {sorted(DARKNET_BLOCKS)}, got {depth}")
        self.out_features = tuple(out_features)
        self.grad_checkpointing = False
        num_blocks = DARKNET_BLOCKS[depth]

        self.stem = nn.Sequential(
            BaseConv(in_channels, stem_out_channels, ksize=3, stride=1, act="lrelu"),
            *self._group(stem_out_channels, num_blocks=1, stride=2),
        )
        channels = stem_out_channels * 2  # 64
        self.dark2 = nn.Sequential(*self._group(channels, num_blocks[0], stride=2))
        channels *= 2  # 128
        self.dark3 = nn.Sequential(*self._group(channels, num_blocks[1], stride=2))
        channels *= 2  # 256
        self.dark4 = nn.Sequential(*self._group(channels, num_blocks[2], stride=2))
        channels *= 2  # 512
        self.dark5 = nn.Sequential(
            *self._group(channels, num_blocks[3], stride=2), *self._spp_block(channels * 2, channels)
        )

    @staticmethod
    def _group(in_channels: int, num_blocks: int, stride: int) -> list[nn.Module]:
        """Strided 3x3 conv doubling the channels, then `num_blocks` residual layers."""
        return [
            BaseConv(in_channels, in_channels * 2, ksize=3, stride=stride, act="lrelu"),
            *[ResLayer(in_channels * 2) for _ in range(num_blocks)],
        ]

    @staticmethod
    def _spp_block(in_channels: int, channels: int) -> list[nn.Module]:
        """YOLOv3-SPP neck of the last stage: in_channels -> channels."""
        return [
            BaseConv(in_channels, channels, 1, stride=1, act="lrelu"),
            BaseConv(channels, channels * 2, 3, stride=1, act="lrelu"),
            SPPBottleneck(channels * 2, channels, activation="lrelu"),
            BaseConv(channels, channels * 2, 3, stride=1, act="lrelu"),
            BaseConv(channels * 2, channels, 1, stride=1, act="lrelu"),
        ]
