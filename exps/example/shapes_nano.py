"""YOLOX-Nano on the built-in synthetic shapes set: the quick start that trains on a laptop CPU.

    python tools/train.py -f exps/example/shapes_nano.py

generates the set on first use (configs/shapes.json: shapes of 16 px up to half the 320 px image),
trains from scratch, evaluates and writes an annotated demo.jpg next to the checkpoints: AP50 above 0.8
on the validation split after 15 epochs (three seeds; figures in docs/results.md), about 14 minutes on
a quiet 2-core CPU.
The recipe differs from COCO's because the budget is minutes, not days: 30x the learning rate per
image with a one-epoch warmup, small batches (twice the optimizer steps of batch 16 for the same
images: from scratch, batch 16 sometimes sat on a loss plateau for two of the twelve epochs), a
smaller input, no mosaic (hence no affine) and no mixup, a final learning rate of a tenth of the peak,
and an EMA that averages the last ~100 steps instead of the last ~3.
Mosaic is what makes YOLOX generalise over 300 epochs, but in a 15-minute budget it costs more than it
gives: measured here at the same learning rate, 12 epochs with half the batches in mosaic reached AP50
0.60, the same 12 epochs without it 0.65, in less time (a mosaic sample decodes four images).
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

        # ---------------- augmentation: HSV and flips only ---------------- #
        self.mosaic_prob = 0.0
        self.enable_mixup = False
        self.mixup_prob = 0.0

        # ---------------- training ---------------- #
        self.max_epoch = 15
        self.warmup_epochs = 1
        self.no_aug_epochs = 2  # L1 loss on for the last two, and an eval after each
        self.basic_lr_per_img = 0.3 / 64.0
        self.min_lr_ratio = 0.1
        self.ema_ramp = 400.0  # averages ~100 steps at the end; YOLOX's 2000 would average ~3 of these 1875
        self.eval_interval = 4
        self.print_interval = 10
        self.save_history_ckpt = False
        self.seed = 0
        self.test_conf = 0.01
