"""YOLOX-X on COCO, the official recipe."""

from yolox_fast.exp import Exp as BaseExp


class Exp(BaseExp):
    def __init__(self):
        super().__init__()
        self.depth = 1.33
        self.width = 1.25
