"""YOLOX-S on Pascal VOC 2007+2012 trainval, evaluated on VOC2007 test (the built-in "voc" description)."""

from yolox_fast.exp import Exp as BaseExp


class Exp(BaseExp):
    def __init__(self):
        super().__init__()
        self.num_classes = 20
        self.depth = 0.33
        self.width = 0.50
        self.dataset = "voc"  # the built-in "voc" description: $YOLOX_DATADIR/VOCdevkit, 20 classes
        self.warmup_epochs = 1
        self.mosaic_prob = 1.0
        self.mixup_prob = 1.0
        self.hsv_prob = 1.0
        self.flip_prob = 0.5
