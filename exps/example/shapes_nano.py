"""YOLOX-Nano on the built-in synthetic shapes set: the quick start that trains on a laptop CPU.

    python tools/train.py -f exps/example/shapes_nano.py

generates the set on first use (the package's data/configs/shapes.json), trains from scratch, evaluates
and writes an annotated demo.jpg next to the checkpoints: AP50 0.58 on the validation split after 12
epochs, 13.5 minutes on a quiet 2-core CPU (measured; still undertrained, see the README).
The recipe differs from COCO's because the budget is minutes, not days: 15x the learning rate per
image with a one-epoch warmup, small batches (twice the optimizer steps of batch 16 for the same
images: from scratch, batch 16 sometimes sat on a loss plateau for two of the twelve epochs),
a smaller input, half the batches without mosaic, no rotation/shear/mixup (the shapes are already
rotated), and a final learning rate of a tenth of the peak.
"""

from yolox_fast.exp import Exp as BaseExp


class Exp(BaseExp):
    def __init__(self):
        super().__init__()
        # ---------------- model: nano ---------------- #
        self.num_classes = 6
        self.depth = 0.33
        self.width = 0.25
        self.depthwise = True

        # ---------------- data ---------------- #
        self.dataset = "shapes"
        self.batch_size = 8  # default of -b for this exp: more, smaller steps learn faster here
        self.data_num_workers = 2
        self.input_size = (256, 256)
        self.random_size = (7, 9)  # multi-scale 224-288 px
        self.test_size = (320, 320)  # the images' own size: small shapes keep every pixel

        # ---------------- augmentation ---------------- #
        self.mosaic_prob = 0.5
        self.mosaic_scale = (0.5, 1.5)
        self.enable_mixup = False
        self.mixup_prob = 0.0
        self.degrees = 0.0
        self.shear = 0.0

        # ---------------- training ---------------- #
        self.max_epoch = 12
        self.warmup_epochs = 1
        self.no_aug_epochs = 2
        self.basic_lr_per_img = 0.15 / 64.0
        self.min_lr_ratio = 0.1
        self.eval_interval = 4
        self.print_interval = 10
        self.save_history_ckpt = False
        self.seed = 0
        self.test_conf = 0.01
