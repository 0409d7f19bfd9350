"""Official YOLOX 0.3.0's `tools/eval.py`, one process, on a CPU: its flags, its steps, in its order.

    $(tools/setup_yolox_reference.sh) benchmarks/kit/official_eval.py -n yolox-nano -c W.pth -b 16 \
        --conf 0.001 --fuse --tsize 416 data_dir DIR val_ann instances_val2017.json num_classes 4

Official's `python -m yolox.tools.eval` cannot run on a machine without CUDA (`torch.cuda.set_device`,
`model.cuda`, and COCOEvaluator.evaluate casts every batch to `torch.cuda.FloatTensor`). This runs what its
`main` runs, with its own parser and exp merge, and only the CUDA calls left out: the logger set up in the
output folder, the model summary (thop FLOPs) and structure logged, the evaluator with per-class AP/AR, the
checkpoint loaded, `fuse_model` with --fuse, then COCOEvaluator.evaluate's inference and scoring
(`benchmarks.kit.official.official_detections` and its `evaluate_prediction`, whose summary is logged).
The last line printed is machine-readable: `detections N AP50:95 X AP50 Y`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch


def main(argv: list[str]) -> None:
    from loguru import logger
    from yolox.exp import get_exp
    from yolox.tools.eval import make_parser
    from yolox.utils import fuse_model, get_model_info, setup_logger

    from benchmarks.kit.official import official_detections

    args = make_parser().parse_args(argv)
    exp = get_exp(args.exp_file, args.name)
    exp.merge(args.opts)
    if not args.experiment_name:
        args.experiment_name = exp.exp_name
    file_name = os.path.join(exp.output_dir, args.experiment_name)
    os.makedirs(file_name, exist_ok=True)
    setup_logger(file_name, distributed_rank=0, filename="val_log.txt", mode="a")
    logger.info(f"Args: {args}")
    if args.conf is not None:
        exp.test_conf = args.conf
    if args.nms is not None:
        exp.nmsthre = args.nms
    if args.tsize is not None:
        exp.test_size = (args.tsize, args.tsize)
    model = exp.get_model()
    logger.info(f"Model Summary: {get_model_info(model, exp.test_size)}")
    logger.info(f"Model Structure:\n{model}")
    evaluator = exp.get_evaluator(args.batch_size, False, args.test, args.legacy)
    evaluator.per_class_AP = True
    evaluator.per_class_AR = True
    model.eval()
    model.load_state_dict(torch.load(args.ckpt, map_location="cpu", weights_only=False)["model"])
    if args.fuse:
        model = fuse_model(model)
    records = official_detections(evaluator, model)
    ap50_95, ap50, summary = evaluator.evaluate_prediction(records, torch.tensor([0.0, 0.0, 1.0]))
    logger.info("\n" + summary)
    print(f"detections {len(records)} AP50:95 {float(ap50_95):.4f} AP50 {float(ap50):.4f}")


if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parents[2])  # `benchmarks` from the repository root
    main(sys.argv[1:])
