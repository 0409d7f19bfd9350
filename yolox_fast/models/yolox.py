"""YOLOX: a backbone+neck (YOLOPAFPN) followed by the decoupled head."""

from __future__ import annotations

import torch
from torch import nn

from yolox_fast.models.head import YOLOXHead
from yolox_fast.models.pafpn import YOLOPAFPN

# the modules each `freeze` choice keeps fixed: the CSPDarknet, or the CSPDarknet and the PAFPN around it
FREEZABLE = {"none": (), "backbone": ("backbone.backbone",), "backbone+neck": ("backbone",)}


class YOLOX(nn.Module):
    """forward(x (N, 3, H, W) BGR 0-255, targets (N, M, 5) px): training -> loss dict
    {"total_loss", "iou_loss", "conf_loss", "cls_loss", "l1_loss", "num_fg"}; eval -> (N, A, 5 + C).
    """

    def __init__(self, backbone: nn.Module | None = None, head: nn.Module | None = None) -> None:
        super().__init__()
        self.backbone = backbone if backbone is not None else YOLOPAFPN()
        self.head = head if head is not None else YOLOXHead(80)
        self._frozen: list[nn.Module] = []

    def freeze(self, part: str) -> int:
        """Keep `part` (a FREEZABLE key: "none", "backbone", "backbone+neck") at its current weights: no
        gradients, and its BatchNorm layers in eval mode (their statistics frozen too) whatever `train()`
        is asked. Returns the number of parameters left to train."""
        if part not in FREEZABLE:
            raise ValueError(f"freeze must be one of {sorted(FREEZABLE)}, got {part!r}")
        self._frozen = [self.get_submodule(name) for name in FREEZABLE[part]]
        for module in self._frozen:
            module.requires_grad_(False)
        self.train(self.training)
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def train(self, mode: bool = True) -> YOLOX:
        super().train(mode)
        for module in self._frozen:
            module.eval()
        return self

    def enable_l1_loss(self) -> None:
        """Add the L1 loss on raw box offsets from the next step on (YOLOX's last, un-augmented epochs)."""
        self.head.use_l1 = True

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
