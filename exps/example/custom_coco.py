"""Your own COCO-format dataset: copy this file and change what differs.

Layout expected (as configs/coco.json describes it, root replaced by data_dir):
    datasets/my_dataset/annotations/instances_train2017.json
    datasets/my_dataset/annotations/instances_val2017.json
    datasets/my_dataset/train2017/*.jpg
    datasets/my_dataset/val2017/*.jpg
Class names come from the annotation files' categories. Train with
    python tools/train.py -f exps/example/custom_coco.py -b 16 --fp16 -c yolox_s.pth
(-c with official YOLOX-S weights fine-tunes: the class layer, sized for 80 classes, is skipped and listed).
"""

from yolox_fast.exp import Exp as BaseExp


class Exp(BaseExp):
    def __init__(self):
        super().__init__()
        self.depth = 0.33
        self.width = 0.50
        self.dataset = "coco"
        self.data_dir = "datasets/my_dataset"
        self.train_ann = "instances_train2017.json"
        self.val_ann = "instances_val2017.json"
        self.num_classes = 3  # the number of categories in your annotation files

        self.max_epoch = 100
        self.no_aug_epochs = 10
        self.warmup_epochs = 3
        self.eval_interval = 5
        self.input_size = (640, 640)
        self.test_size = (640, 640)
