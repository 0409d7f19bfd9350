"""CSPDarknet: the YOLOX backbone (YOLOv5-style CSP stages, a Focus stem, SPP in the last stage)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from yolox_fast.models.network_blocks import (
    BaseConv,
    CSPLayer,
    DWConv,
    Focus,
    SPPBottleneck,
    run_block,
)

STAGES = ("stem", "dark2", "dark3", "dark4", "dark5")


class CSPDarknet(nn.Module):
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

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        outputs = {}
        for name in STAGES:
            x = run_block(getattr(self, name), x, self.grad_checkpointing)
            outputs[name] = x
        return {k: v for k, v in outputs.items() if k in self.out_features}
