"""YOLOX: a backbone+neck (YOLOPAFPN) followed by the decoupled head."""

from __future__ import annotations

import torch
from torch import nn

from yolox_fast.models.head import YOLOXHead
from yolox_fast.models.pafpn import YOLOPAFPN


class YOLOX(nn.Module):
    """forward(x (N, 3, H, W) BGR 0-255, targets (N, M, 5) px): training -> loss dict
    {"total_loss", "iou_loss", "conf_loss", "cls_loss", "l1_loss", "num_fg"}; eval -> (N, A, 5 + C).
    """

    def __init__(self, backbone: nn.Module | None = None, head: nn.Module | None = None) -> None:
        super().__init__()
        self.backbone = backbone if backbone is not None else YOLOPAFPN()
        self.head = head if head is not None else YOLOXHead(80)

    def set_grad_checkpointing(self, enabled: bool = True) -> None:
        """Trade compute for memory: backbone stages and PAFPN CSP blocks are recomputed in backward.

        Only active in training mode with grad enabled; results and gradients are unchanged.
        """
        self.backbone.set_grad_checkpointing(enabled)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        fpn_outs = self.backbone(x)
        if self.training:
            return self.head(fpn_outs, targets)
        return self.head(fpn_outs)
