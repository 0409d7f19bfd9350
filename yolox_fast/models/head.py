"""YOLOXHead: the decoupled, anchor-free head (separate classification and regression branches)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from yolox_fast.models.losses import YOLOXLoss
from yolox_fast.models.network_blocks import BaseConv, DWConv

LossFn = Callable[..., dict]


def level_grid(h: int, w: int, stride: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One FPN level's cell indices (h*w, 2) as (x, y), row-major, and its strides (h*w,): what
    `YOLOXHead.decode_boxes` takes (also for outputs a runtime left undecoded)."""
    ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    grid = torch.stack((xs, ys), dim=2).reshape(h * w, 2).to(dtype)
    return grid, torch.full((h * w,), stride, device=device, dtype=dtype)


class YOLOXHead(nn.Module):
    """Per FPN level: 1x1 stem, then a cls branch (two 3x3 convs -> C logits) and a reg branch
    (two 3x3 convs -> 4 box offsets and 1 objectness logit). One prediction per grid cell.

    Eval forward: list of (N, Ci, H/s, W/s) -> (N, A, 5 + C) rows [cx, cy, w, h (px), obj, cls...]
    with sigmoids applied, A = sum of (H/s) * (W/s) over strides 8/16/32, levels in that order,
    cells row-major. With `decode_in_inference = False` the box columns stay raw (for export).
    Training forward: the loss dict of `loss_fn`.

    `loss_fn` (default `YOLOXLoss()`: YOLOX's SimOTA settings) is called as `loss_fn(pred_boxes,
    obj_logits, cls_logits, raw_reg, grids, strides, labels, use_l1=...)` with the arguments `yolox_loss`
    documents; pass another (other SimOTA settings, a timed one, one that records its inputs) to change
    or watch the training loss without patching any module. `use_l1` (YOLOX's switch of the same name)
    adds the L1 loss on raw box offsets: on in the last, un-augmented epochs.
    """

    # kept eager by `compile_module`: the assignment's shapes depend on the data (a graph per batch
    # otherwise). Not a decorator: torch.compiler.disable imports torch._dynamo, most of a second of
    # every tool's start, also where nothing is compiled
    eager_under_compile = ("_losses",)

    def __init__(
        self,
        num_classes: int,
        width: float = 1.0,
        strides: Sequence[int] = (8, 16, 32),
        in_channels: Sequence[int] = (256, 512, 1024),
        act: str = "silu",
        depthwise: bool = False,
        loss_fn: LossFn | None = None,
    ) -> None:
        super().__init__()
        if len(strides) != len(in_channels):
            raise ValueError(f"{len(strides)} strides for {len(in_channels)} input levels")
        self.num_classes = num_classes
        self.strides = tuple(strides)
        self.decode_in_inference = True
        self.loss_fn: LossFn = loss_fn or YOLOXLoss()
        self.use_l1 = False

        conv = DWConv if depthwise else BaseConv
        hidden = int(256 * width)
        # registration order = official YOLOX's, so state_dict and parameter order (optimizer state) match
        self.cls_convs = nn.ModuleList()
        self.reg_convs = nn.ModuleList()
        self.cls_preds = nn.ModuleList()
        self.reg_preds = nn.ModuleList()
        self.obj_preds = nn.ModuleList()
        self.stems = nn.ModuleList()
        for c in in_channels:
            self.stems.append(BaseConv(int(c * width), hidden, 1, 1, act=act))
            self.cls_convs.append(
                nn.Sequential(conv(hidden, hidden, 3, 1, act=act), conv(hidden, hidden, 3, 1, act=act))
            )
            self.reg_convs.append(
                nn.Sequential(conv(hidden, hidden, 3, 1, act=act), conv(hidden, hidden, 3, 1, act=act))
            )
            self.cls_preds.append(nn.Conv2d(hidden, num_classes, 1, 1, 0))
            self.reg_preds.append(nn.Conv2d(hidden, 4, 1, 1, 0))
            self.obj_preds.append(nn.Conv2d(hidden, 1, 1, 1, 0))
        # (level, h, w, device, dtype) -> (cell indices (h*w, 2) as (x, y), strides (h*w,)); not state
        self._grid_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def initialize_biases(self, prior_prob: float) -> None:
        """Start cls and obj probabilities at `prior_prob` so early training is not swamped by negatives."""
        bias = -math.log((1 - prior_prob) / prior_prob)
        for conv in list(self.cls_preds) + list(self.obj_preds):
            nn.init.constant_(conv.bias, bias)

    def _level_grid(self, k: int, h: int, w: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():
            # in a compiled graph the grid is folded in; filling the cache would change what the graph's
            # guards saw and recompile it once on the next call
            return level_grid(h, w, self.strides[k], device, dtype)
        key = (k, h, w, device, dtype)
        if key not in self._grid_cache:
            self._grid_cache[key] = level_grid(h, w, self.strides[k], device, dtype)
        return self._grid_cache[key]

    def grids_and_strides(
        self, sizes: Sequence[tuple[int, int]], device, dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell indices (A, 2) as (x, y) and strides (A,) for level feature sizes [(h, w), ...]."""
        parts = [self._level_grid(k, h, w, device, dtype) for k, (h, w) in enumerate(sizes)]
        return torch.cat([g for g, _ in parts]), torch.cat([s for _, s in parts])

    def forward(self, xin: Sequence[torch.Tensor], labels: torch.Tensor | None = None):
        raw: list[torch.Tensor] = []  # per level (N, 5 + C, h, w): reg(4), obj logit, cls logits
        for k, x in enumerate(xin):
            x = self.stems[k](x)
            cls_feat = self.cls_convs[k](x)
            reg_feat = self.reg_convs[k](x)
            raw.append(
                torch.cat(
                    [self.reg_preds[k](reg_feat), self.obj_preds[k](reg_feat), self.cls_preds[k](cls_feat)], 1
                )
            )
        sizes = [(r.shape[2], r.shape[3]) for r in raw]
        out = torch.cat([r.flatten(start_dim=2) for r in raw], dim=2).permute(0, 2, 1)  # (N, A, 5 + C)

        if self.training:
            return self._losses(out, sizes, labels)

        out = torch.cat([out[..., :4], out[..., 4:].sigmoid()], dim=-1)
        if not self.decode_in_inference:
            return out
        grids, strides = self.grids_and_strides(sizes, out.device, out.dtype)
        return torch.cat([self.decode_boxes(out[..., :4], grids, strides), out[..., 4:]], dim=-1)

    @staticmethod
    def decode_boxes(raw_reg: torch.Tensor, grids: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
        """Raw box outputs (N, A, 4) -> cx, cy, w, h px: xy = (offset + cell) * stride,
        wh = exp(offset) * stride.

        grids (A, 2) cell indices (x, y), strides (A,); computed in the dtype of the inputs.
        """
        strides = strides[:, None]
        return torch.cat(
            [(raw_reg[..., :2] + grids) * strides, torch.exp(raw_reg[..., 2:4]) * strides], dim=-1
        )

    def _losses(self, out: torch.Tensor, sizes: Sequence[tuple[int, int]], labels: torch.Tensor | None):
        if labels is None:
            raise ValueError("YOLOXHead in training mode needs labels (N, M, 5) [cls, cx, cy, w, h] px")
        raw_reg = out[..., :4]
        # boxes are decoded in fp32 even under AMP: exp() of fp16 offsets overflows early in training
        grids, strides = self.grids_and_strides(sizes, out.device, torch.float32)
        pred_boxes = self.decode_boxes(raw_reg.float(), grids, strides)  # (N, A, 4) cx, cy, w, h px
        return self.loss_fn(
            pred_boxes,
            out[..., 4:5],
            out[..., 5:],
            raw_reg,
            grids,
            strides,
            labels,
            use_l1=self.use_l1,
        )
