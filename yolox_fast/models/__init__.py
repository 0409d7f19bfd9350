"""YOLOX model zoo: blocks, CSPDarknet backbone, PAFPN neck, decoupled head, the YOLOX wrapper."""

from yolox_fast.models.darknet import CSPDarknet
from yolox_fast.models.head import YOLOXHead
from yolox_fast.models.network_blocks import (
    BaseConv,
    Bottleneck,
    CSPLayer,
    DWConv,
    Focus,
    SPPBottleneck,
    fuse_model,
    get_activation,
)
from yolox_fast.models.pafpn import YOLOPAFPN
from yolox_fast.models.yolox import YOLOX

__all__ = [
    "YOLOPAFPN",
    "YOLOX",
    "BaseConv",
    "Bottleneck",
    "CSPDarknet",
    "CSPLayer",
    "DWConv",
    "Focus",
    "SPPBottleneck",
    "YOLOXHead",
    "fuse_model",
    "get_activation",
]
