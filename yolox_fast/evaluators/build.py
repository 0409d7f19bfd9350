"""build_evaluator: the COCO or VOC evaluator for an exp's validation split, by the dataset's format
(a YOLO-format set is scored with the COCO metric on its labels, converted in memory)."""

from __future__ import annotations

from yolox_fast.data.build import dataset_config
from yolox_fast.evaluators.coco import COCOEvaluator
from yolox_fast.evaluators.voc import VOCEvaluator


def build_evaluator(exp, batch_size: int, is_distributed: bool, testdev: bool = False):
    """COCOEvaluator or VOCEvaluator over `exp.get_eval_loader(batch_size, is_distributed)`.

    The choice follows the dataset description `exp.dataset`: its "metric" when it names one, else
    the VOC devkit's for a VOCdevkit set (VOC-format `sets`) and COCO's for every other (COCO, YOLO, and
    VOC XML folders such as LabelImg's: the metric people quote for their own data); thresholds and
    input size come from exp.test_conf, exp.nmsthre, exp.test_size. VOC: 11-point AP when every val set
    is VOC2007, else area under the PR curve. `testdev` (COCO only) writes the result json for the
    test-dev server instead of scoring.
    """
    cfg = dataset_config(exp)
    fmt = cfg.get("metric") or ("voc" if cfg["format"] == "voc" and "sets" in cfg["val"] else "coco")
    loader = exp.get_eval_loader(batch_size, is_distributed)
    class_names = exp.get_class_names()
    common = dict(
        dataloader=loader,
        img_size=exp.test_size,
        confthre=exp.test_conf,
        nmsthre=exp.nmsthre,
        num_classes=exp.num_classes,
        class_names=class_names,
    )
    if fmt == "voc":
        if testdev:
            raise ValueError("--test (COCO test-dev) does not apply to a VOC-format dataset")
        # VOC2007 test is scored with the 11-point AP of its devkit; later years use the area under the curve
        use_07 = all(str(year) == "2007" for year, _ in cfg["val"].get("sets", [("", "")]))
        return VOCEvaluator(**common, use_07_metric=use_07)
    return COCOEvaluator(**common, testdev=testdev, scorer=getattr(exp, "coco_scorer", "auto"))
