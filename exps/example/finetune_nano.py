"""Fine-tune a COCO-trained YOLOX-Nano on your own few hundred labelled photos: point `dataset` at the folder
the labelling tool wrote (LabelImg / CVAT XML, a Roboflow export, YOLO, COCO, VOC; docs/datasets.md) and
give the weights:

    python tools/train.py -f exps/example/finetune_nano.py -c yolox_nano.pth dataset datasets/my_photos

The class count and names come from the data. The recipe is for a few hundred images on a small machine;
docs/results.md has what it reaches on a real set and in how many minutes, and how each choice was measured.
"""

from yolox_fast.exp.default.yolox_nano import Exp as NanoExp


class Exp(NanoExp):
    def __init__(self):
        super().__init__()
        self.dataset = "datasets/my_photos"
        self.num_classes = None  # as many as the dataset has

        self.max_epoch = 15
        self.warmup_epochs = 1
        self.no_aug_epochs = 2
        self.eval_interval = 1
        self.mosaic_prob = 1.0
        self.random_size = (13, 13)  # one input size: 416 px
        self.basic_lr_per_img = 0.01 / 64
        self.batch_size = 8
        self.data_num_workers = 2
        self.save_history_ckpt = False
