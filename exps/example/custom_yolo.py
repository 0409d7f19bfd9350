"""Your own dataset in Ultralytics YOLO format: copy this file and change what differs.

Layout expected (what Ultralytics reads, unchanged):
    datasets/my_yolo/data.yaml            train: images/train
                                          val: images/val
                                          names: [cat, dog, bird]   (or {0: cat, 1: dog, 2: bird})
    datasets/my_yolo/images/train/*.jpg   datasets/my_yolo/labels/train/*.txt
    datasets/my_yolo/images/val/*.jpg     datasets/my_yolo/labels/val/*.txt
One label line per box, "class cx cy w h" normalised to the image; no label file = no objects.
Check the data first, then train (class names come from data.yaml; evaluation is COCO AP):
    python tools/check_dataset.py -f exps/example/custom_yolo.py
    python tools/train.py -f exps/example/custom_yolo.py -b 16 --fp16 -c yolox_s.pth
Another data.yaml without editing this file: `... dataset path/to/data.yaml num_classes 5`.
(-c with official YOLOX-S weights fine-tunes: the class layer, sized for 80 classes, is skipped and listed).
"""

from yolox_fast.exp import Exp as BaseExp


class Exp(BaseExp):
    def __init__(self):
        super().__init__()
        self.depth = 0.33  # YOLOX-S
        self.width = 0.50
        self.dataset = "datasets/my_yolo/data.yaml"
        self.num_classes = 3  # the number of names in your data.yaml

        # a fine-tuning recipe for a few thousand images
        self.max_epoch = 100
        self.no_aug_epochs = 10
        self.warmup_epochs = 3
        self.eval_interval = 5
        self.input_size = (640, 640)
        self.test_size = (640, 640)
