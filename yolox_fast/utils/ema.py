"""Exponential moving average of model weights with the YOLOX warm-up ramp of the decay."""

from __future__ import annotations

import math
from copy import deepcopy
from typing import Any

import torch
from torch import nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel / DataParallel wrapper (or the model itself)."""
    return (
        model.module if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else model
    )


class ModelEMA:
    """Keeps ``ema = d * ema + (1 - d) * model`` over every floating-point parameter and buffer.

    The decay ramps up as ``d = decay * (1 - exp(-updates / ramp))``, so the average follows the
    fast-changing weights of early training and only smooths strongly later (YOLOX: decay 0.9998,
    ramp 2000). Integer buffers (BN ``num_batches_tracked``) are copied.
    """

    def __init__(
        self, model: nn.Module, decay: float = 0.9998, updates: int = 0, ramp: float = 2000.0
    ) -> None:
        self.ema = deepcopy(unwrap_model(model)).eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.decay_max = decay
        self.ramp = ramp
        self.updates = updates

    def decay(self, updates: int) -> float:
        return self.decay_max * (1.0 - math.exp(-updates / self.ramp))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.decay(self.updates)
        src = unwrap_model(model).state_dict()
        floats_ema, floats_src = [], []
        for name, value in self.ema.state_dict().items():
            if value.dtype.is_floating_point:
                floats_ema.append(value)
                floats_src.append(src[name].detach())
            else:
                value.copy_(src[name])
        # lerp(ema, model, 1 - d) == d * ema + (1 - d) * model, one fused kernel per dtype/device group
        torch._foreach_lerp_(floats_ema, floats_src, 1.0 - d)

    def state_dict(self) -> dict[str, Any]:
        """The update count and the decay settings; the averaged weights are saved as the checkpoint's
        ``model``."""
        return {"updates": self.updates, "decay": self.decay_max, "ramp": self.ramp}

    def load_state_dict(self, meta: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
        """Restore the update count and decay settings from ``meta`` (a checkpoint from before they were
        saved keeps this instance's) and the averaged weights from ``weights``."""
        self.ema.load_state_dict(weights)
        self.updates = int(meta["updates"])
        self.decay_max = float(meta.get("decay", self.decay_max))
        self.ramp = float(meta.get("ramp", self.ramp))
