"""YOLOX-M on COCO, the official recipe."""

from yolox_fast.exp import Exp as BaseExp


class Exp(BaseExp):
    def __init__(self):
        super().__init__()
        self.depth = 0.67
        self.width = 0.75
