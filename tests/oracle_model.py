"""A stand-in detector for evaluator tests: it 'predicts' pre-set boxes for each image it recognises.

Images are recognised by the bytes of their letterboxed tensor, so the predictions do not depend on
batch composition, on which rank sees the image, or on the loader order.
"""

import hashlib

import numpy as np
import torch
import torch.nn as nn


def image_key(img: torch.Tensor) -> str:
    return hashlib.sha1(img.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


class OracleModel(nn.Module):
    """forward(x (B, 3, H, W)) -> (B, R, 5 + C) rows [cx, cy, w, h, obj, class probs] from `table`."""

    def __init__(self, table: dict[str, np.ndarray], num_classes: int) -> None:
        super().__init__()
        self.table = table
        self.num_classes = num_classes
        self.rows = max([len(v) for v in table.values()] + [1])
        self.anchor = nn.Parameter(torch.zeros(1))  # evaluators read the device from the parameters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], self.rows, 5 + self.num_classes)
        for i in range(x.shape[0]):
            rows = self.table[image_key(x[i])]
            out[i, : len(rows)] = torch.from_numpy(rows).float()
        return out


def oracle_for(dataset, num_classes: int, input_size, noise: bool, seed: int = 0):
    """(OracleModel, expected) for every image of an eval `dataset`.

    noise=False: every ground-truth box, score 1 (a perfect detector). noise=True: boxes jittered,
    about one in four dropped, one false positive per image, scores spread in (0.05, 1).
    `expected`: image id -> (K, 6) [x1, y1, x2, y2, score, cls] in original pixels, what the
    evaluator should reconstruct from the model output.
    """
    rng = np.random.default_rng(seed)
    table, expected = {}, {}
    for i in range(len(dataset)):
        img, target, (h, w), img_id = dataset[i]
        r = min(input_size[0] / h, input_size[1] / w)
        boxes = np.asarray(target[:, :4], dtype=np.float64)
        classes = np.asarray(target[:, 4]).astype(int)
        scores = np.ones(len(boxes))
        if noise:
            boxes = boxes + rng.normal(0, 2.0, boxes.shape)
            keep = rng.random(len(boxes)) > 0.25
            boxes, classes, scores = boxes[keep], classes[keep], rng.uniform(0.05, 1.0, keep.sum())
            fp = np.array([[5.0, 5.0, 40.0, 30.0]]) + rng.uniform(0, 60, (1, 1))
            boxes = np.concatenate([boxes, fp])
            classes = np.concatenate([classes, rng.integers(0, num_classes, 1)])
            scores = np.concatenate([scores, rng.uniform(0.05, 1.0, 1)])
        rows: list[np.ndarray] = []
        for (x1, y1, x2, y2), c, s in zip(boxes * r, classes, scores):
            row = np.zeros(5 + num_classes)
            row[:5] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, s]
            row[5 + c] = 1.0
            rows.append(row)
        table[image_key(torch.from_numpy(np.asarray(img)))] = np.array(rows).reshape(-1, 5 + num_classes)
        expected[int(img_id)] = np.column_stack([boxes, scores, classes]).reshape(-1, 6)
    return OracleModel(table, num_classes), expected


def shapes_exp(config_path: str, test_size=(64, 96)):
    """A nano exp on a generated shapes set; thresholds that keep every oracle box (no NMS merging)."""
    from yolox_fast.exp import get_exp

    exp = get_exp(exp_name="yolox-nano")
    exp.dataset = config_path
    exp.num_classes = 6
    exp.test_size = tuple(test_size)
    exp.data_num_workers = 0
    exp.test_conf = 0.001
    exp.nmsthre = 1.0
    return exp
