"""YOLOPAFPN: CSPDarknet followed by a top-down FPN and a bottom-up PAN path of CSP blocks."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from yolox_fast.models.darknet import CSPDarknet
from yolox_fast.models.network_blocks import BaseConv, CSPLayer, DWConv, run_block


class YOLOPAFPN(nn.Module):
    """Backbone + PAFPN neck. (N, 3, H, W) -> (P3, P4, P5) at strides 8/16/32 with
    int(in_channels[i] * width) channels each.

    Module names (backbone, lateral_conv0, C3_p4, reduce_conv1, C3_p3, bu_conv2, C3_n3, bu_conv1,
    C3_n4) are official YOLOX's, so its checkpoints load unchanged.
    """

    def __init__(
        self,
        depth: float = 1.0,
        width: float = 1.0,
        in_features: Sequence[str] = ("dark3", "dark4", "dark5"),
        in_channels: Sequence[int] = (256, 512, 1024),
        depthwise: bool = False,
        act: str = "silu",
    ) -> None:
        super().__init__()
        self.backbone = CSPDarknet(depth, width, out_features=in_features, depthwise=depthwise, act=act)
        self.in_features = tuple(in_features)
        self.grad_checkpointing = False
        conv = DWConv if depthwise else BaseConv
        c3, c4, c5 = (int(c * width) for c in in_channels)
        n = round(3 * depth)

        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        # top-down
        self.lateral_conv0 = BaseConv(c5, c4, 1, 1, act=act)
        self.C3_p4 = CSPLayer(2 * c4, c4, n, False, depthwise=depthwise, act=act)
        self.reduce_conv1 = BaseConv(c4, c3, 1, 1, act=act)
        self.C3_p3 = CSPLayer(2 * c3, c3, n, False, depthwise=depthwise, act=act)
        # bottom-up
        self.bu_conv2 = conv(c3, c3, 3, 2, act=act)
        self.C3_n3 = CSPLayer(2 * c3, c4, n, False, depthwise=depthwise, act=act)
        self.bu_conv1 = conv(c4, c4, 3, 2, act=act)
        self.C3_n4 = CSPLayer(2 * c4, c5, n, False, depthwise=depthwise, act=act)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Recompute backbone stages and the four CSP blocks in backward instead of storing them."""
        self.grad_checkpointing = enabled
        self.backbone.grad_checkpointing = enabled

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.backbone(x)
        x2, x1, x0 = (features[f] for f in self.in_features)  # strides 8, 16, 32
        ckpt = self.grad_checkpointing

        fpn_out0 = self.lateral_conv0(x0)  # c5 -> c4, /32
        f_out0 = torch.cat([self.upsample(fpn_out0), x1], 1)  # 2*c4, /16
        f_out0 = run_block(self.C3_p4, f_out0, ckpt)  # c4, /16

        fpn_out1 = self.reduce_conv1(f_out0)  # c4 -> c3, /16
        f_out1 = torch.cat([self.upsample(fpn_out1), x2], 1)  # 2*c3, /8
        pan_out2 = run_block(self.C3_p3, f_out1, ckpt)  # c3, /8

        p_out1 = torch.cat([self.bu_conv2(pan_out2), fpn_out1], 1)  # 2*c3, /16
        pan_out1 = run_block(self.C3_n3, p_out1, ckpt)  # c4, /16

        p_out0 = torch.cat([self.bu_conv1(pan_out1), fpn_out0], 1)  # 2*c4, /32
        pan_out0 = run_block(self.C3_n4, p_out0, ckpt)  # c5, /32

        return pan_out2, pan_out1, pan_out0
