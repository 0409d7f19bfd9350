"""(f) Evaluation: official YOLOX 0.3.0 against yolox_fast, from the image file to the AP.

- preprocessing: official COCODataset + ValTransform items vs yolox_fast's eval dataset items (letterbox,
  (h, w) info, image ids) on a generated set with non-square images and category ids 3, 7, 11, 20;
- postprocess (confidence threshold, per-class and class-agnostic NMS) on the same model outputs;
- the whole evaluation (loader -> model -> postprocess -> COCO records -> COCOeval) of both, with the
  same stand-in model: one that looks its outputs up by the bytes of the letterboxed image it gets
  (boxes near the ground truth, duplicates, low scores, noise), so it also checks that both hand the
  model the same pixels.

    PYTHONPATH=. $YOLOX_REFERENCE_PYTHON tests/yolox_reference/eval_pipeline.py
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tempfile
from pathlib import Path

import common
import numpy as np
import torch
from torch import nn

NUM_CLASSES = 4
TEST_SIZE = (224, 288)  # (H, W)
ROWS = 400  # output rows per image


def key(img: torch.Tensor) -> str:
    return hashlib.sha1(img.detach().float().contiguous().numpy().tobytes()).hexdigest()


class LookupModel(nn.Module):
    """Eval-mode stand-in: (B, 3, H, W) letterboxed images -> (B, ROWS, 5 + C) decoded outputs, looked up
    by image content (KeyError if an image differs from the ones the table was made from)."""

    def __init__(self, table: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.table = table
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.table[key(img)].clone() for img in x])


def fake_outputs(gt: np.ndarray, ratio: float, rng: np.random.Generator) -> torch.Tensor:
    """(ROWS, 5 + C) rows [cx, cy, w, h, obj, cls probs] at the network input for one image's ground
    truth (K, 5) [x1, y1, x2, y2, cls] in original px."""
    out = np.zeros((ROWS, 5 + NUM_CLASSES), dtype=np.float32)
    out[:, 2:4] = 1.0
    rows = []
    for x1, y1, x2, y2, cls in gt:
        for _ in range(int(rng.integers(1, 4))):  # a few overlapping candidates per object
            w, h = (x2 - x1) * ratio, (y2 - y1) * ratio
            cx, cy = (x1 + x2) / 2 * ratio, (y1 + y2) / 2 * ratio
            jitter = rng.normal(0, 0.08, 4)
            probs = rng.uniform(0, 0.3, NUM_CLASSES)
            probs[int(cls) if rng.random() < 0.85 else rng.integers(NUM_CLASSES)] = rng.uniform(0.3, 1)
            rows.append([cx + jitter[0] * w, cy + jitter[1] * h, w * np.exp(jitter[2]), h * np.exp(jitter[3]),
                         rng.uniform(0.05, 1), *probs])  # fmt: skip
    for _ in range(40):  # noise, part of it under the confidence threshold
        rows.append([*rng.uniform(0, TEST_SIZE[1], 2), *rng.uniform(4, 80, 2), rng.uniform(0, 0.3),
                     *rng.uniform(0, 0.5, NUM_CLASSES)])  # fmt: skip
    rows = np.array(rows, dtype=np.float32)[:ROWS]
    out[: len(rows)] = rows
    return torch.from_numpy(out[rng.permutation(ROWS)])


def compare_postprocess(rng: np.random.Generator) -> dict:
    from yolox.utils import postprocess as official_postprocess

    from yolox_fast.utils.boxes import postprocess

    worst, count_mismatch, cases = 0.0, 0, 0
    for agnostic in (False, True):
        for conf, nms in ((0.01, 0.65), (0.3, 0.45), (0.001, 0.5)):
            pred = torch.from_numpy(rng.uniform(0, 1, (3, 500, 5 + NUM_CLASSES)).astype(np.float32))
            pred[..., :2] *= 200
            pred[..., 2:4] = pred[..., 2:4] * 60 + 2
            a = official_postprocess(pred.clone(), NUM_CLASSES, conf, nms, class_agnostic=agnostic)
            b = postprocess(pred, NUM_CLASSES, conf, nms, class_agnostic=agnostic)
            for x, y in zip(a, b):
                cases += 1
                if (x is None) != (y is None) or (x is not None and x.shape != y.shape):
                    count_mismatch += 1
                elif x is not None:
                    worst = max(worst, float((x - y).abs().max()))
    return {"cases": cases, "count_mismatches": count_mismatch, "max_abs_diff": worst}


def collect(argv: list[str] | None = None) -> dict:
    from benchmarks.kit.fidelity_data import make_fidelity_set
    from benchmarks.kit.official import official_detections, official_nano_exp
    from yolox_fast.evaluators.coco import coco_score, detections_to_coco_json
    from yolox_fast.evaluators.detection_evaluator import run_inference
    from yolox_fast.exp import get_exp

    rng = np.random.default_rng(0)
    result = {"postprocess": compare_postprocess(rng)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "fidelity_shapes"
        dataset_json = make_fidelity_set(root, num_train=2, num_val=16, size=256, non_square=0.6)
        ours_exp = get_exp(exp_name="yolox-nano")
        ours_exp.merge(
            ["dataset", str(dataset_json), "num_classes", str(NUM_CLASSES), "data_num_workers", "0"]
        )
        ours_exp.test_size = TEST_SIZE
        with contextlib.redirect_stdout(io.StringIO()):
            official_exp = official_nano_exp(
                {"num_classes": NUM_CLASSES, "data_dir": str(root), "val_ann": "instances_val2017.json",
                 "test_size": TEST_SIZE, "data_num_workers": 0, "test_conf": 0.01, "nmsthre": 0.65}
            )  # fmt: skip
            official_evaluator = official_exp.get_evaluator(batch_size=4, is_distributed=False)
        ours_evaluator = ours_exp.get_evaluator(batch_size=4, is_distributed=False)

        # preprocessing, item by item
        ours_items = ours_evaluator.dataloader.dataset
        official_items = official_evaluator.dataloader.dataset
        pixel_diff, info_mismatch = 0.0, 0
        table = {}
        for i in range(len(ours_items)):
            img, target, info, img_id = ours_items[i]
            o_img, _, o_info, o_id = official_items[i]
            pixel_diff = max(pixel_diff, float(np.abs(img - o_img).max()))
            info_mismatch += tuple(info) != tuple(o_info) or int(img_id) != int(np.asarray(o_id).item())
            ratio = min(TEST_SIZE[0] / info[0], TEST_SIZE[1] / info[1])
            table[key(torch.from_numpy(img))] = fake_outputs(target, ratio, rng)
        result["preprocess"] = {
            "images": len(ours_items),
            "non_square_images": int(
                sum(h != w for h, w in (ours_items[i][2] for i in range(len(ours_items))))
            ),
            "max_abs_pixel_diff": pixel_diff,
            "info_or_id_mismatches": info_mismatch,
            "category_ids": list(ours_items.class_ids),
            "official_class_ids": list(official_items.class_ids),
        }

        # the whole evaluation, same stand-in model
        model = LookupModel(table).eval()
        official_records = official_detections(official_evaluator, model)
        with contextlib.redirect_stdout(io.StringIO()):
            official_ap = official_evaluator.evaluate_prediction(
                official_records, torch.tensor([0.0, 0.0, 1.0])
            )
        inference = run_inference(
            model, ours_evaluator.dataloader, TEST_SIZE, NUM_CLASSES, ours_exp.test_conf, ours_exp.nmsthre
        )
        ours_records = detections_to_coco_json(inference.detections, ours_items.class_ids)
        ours_ap50_95, ours_ap50, _ = ours_evaluator.evaluate(model)
        # our scoring on official's records too: the scorers alone
        ours_on_official = coco_score(
            ours_items.coco,
            {
                img_id: np.array(
                    [
                        [
                            *r["bbox"][:2],
                            r["bbox"][0] + r["bbox"][2],
                            r["bbox"][1] + r["bbox"][3],
                            r["score"],
                            list(ours_items.class_ids).index(r["category_id"]),
                        ]
                        for r in official_records
                        if r["image_id"] == img_id
                    ]  # fmt: skip
                ).reshape(-1, 6)
                for img_id in ours_items.ids
            },
            ours_items.class_ids,
        )

        def by_image(records):
            """image id -> rows (category, score, x, y, w, h) sorted by category, then score."""
            out = {}
            for r in records:
                out.setdefault(int(r["image_id"]), []).append(
                    (r["category_id"], float(r["score"]), *r["bbox"])
                )
            return {k: np.array(sorted(v, key=lambda row: (row[0], -row[1]))) for k, v in out.items()}

        a, b = by_image(official_records), by_image(ours_records)
        same_rows = a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
        row_diff = max((float(np.abs(a[k] - b[k]).max()) for k in a), default=0.0) if same_rows else None
        result["evaluation"] = {
            "official_records": len(official_records),
            "ours_records": len(ours_records),
            "same_rows_per_image": same_rows,
            "max_abs_row_diff": row_diff,  # over category, score and bbox
            "official_ap50_95": float(official_ap[0]),
            "official_ap50": float(official_ap[1]),
            "ours_ap50_95": float(ours_ap50_95),
            "ours_ap50": float(ours_ap50),
            "ours_scoring_official_records_ap50_95": ours_on_official["ap50_95"],
            "test_conf": ours_exp.test_conf,
            "nmsthre": ours_exp.nmsthre,
            "official_test_conf": official_exp.test_conf,
            "official_nmsthre": official_exp.nmsthre,
        }
    return result


if __name__ == "__main__":
    common.run(collect)
