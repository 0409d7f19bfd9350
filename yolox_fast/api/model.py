"""`YOLOX`: the Python API. One object per model (a zoo name, a checkpoint, an exported file or an exp) that
predicts, validates, trains and exports in this process through the same code as the command-line tools
(the Predictor for `predict`, tools/eval.py's `evaluate`, the trainer, tools/export.py's `main`).

    model = YOLOX("yolox-s")                      # official COCO weights, fetched once (utils/hub.py)
    results = model.predict("photos/", conf=0.3)  # one Results per image
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from yolox_fast.api.results import Results
from yolox_fast.api.sources import read_sources
from yolox_fast.core.cli import parse_with_overrides
from yolox_fast.core.demo import DEMO_CONF, DEMO_NMS
from yolox_fast.exp import BaseExp, get_exp_by_checkpoint, get_exp_by_file, get_exp_by_name
from yolox_fast.exp.build import exp_names
from yolox_fast.export import exported_format, load_exported_model
from yolox_fast.inference import Predictor, load_inference_model
from yolox_fast.inference.predictor import NO_WEIGHTS
from yolox_fast.utils.hub import fetch_weights, weights_key


class YOLOX:
    """A detector: `YOLOX(model, exp=None, device="cpu", random_weights=False)`.

    `model`: a zoo name with official weights ("yolox-s", fetched once into the cache), a checkpoint of ours
    (its exp is rebuilt from it) or official YOLOX's (give `exp`), an exported file (.onnx, .xml,
    .torchscript: it carries its metadata), an exp file (.py), an exp name without weights ("shapes-nano")
    or an exp object. `exp` (a file, a name or an exp object) replaces the exp the model would bring.
    A model without weights predicts, validates and exports only with `random_weights=True`; it trains
    from scratch either way. `device`: "cpu", "cuda" or a torch.device, for `predict`.
    """

    def __init__(
        self,
        model: str | os.PathLike | BaseExp,
        exp: str | os.PathLike | BaseExp | None = None,
        device: str | torch.device = "cpu",
        random_weights: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.random_weights = random_weights
        self.weights: str | None = None  # a checkpoint or exported file
        self.exp: BaseExp | None = None
        if isinstance(model, BaseExp):
            self.exp = model
        else:
            self._open(str(model))
        if exp is not None:
            self.exp = exp if isinstance(exp, BaseExp) else _exp_of(str(exp))
        if self.exp is None and not self.exported:
            raise ValueError(
                f"{model} stores no exp (official YOLOX weights?): give exp= (a file, a name such as "
                "'yolox-s', or an exp object)"
            )
        self._predictor: Predictor | None = None
        self._class_names: tuple[str, ...] = ()

    def _open(self, source: str) -> None:
        if os.path.isfile(source):
            if source.endswith(".py"):
                self.exp = get_exp_by_file(source)
            elif exported_format(source):
                self.weights = source
            else:
                self.weights = source
                self.exp = _checkpoint_exp(source)
        elif weights_key(source) is not None:
            self.weights = str(fetch_weights(source))
            self.exp = get_exp_by_name(source)
        elif source.strip().lower().replace("_", "-") in exp_names():
            self.exp = get_exp_by_name(source)
        else:
            raise FileNotFoundError(
                f"{source} is no checkpoint, exported file or exp file here, nor a name; names: "
                f"{', '.join(exp_names())}"
            )

    @property
    def exported(self) -> bool:
        """Whether the model is an exported file (its precision, input size and classes are fixed)."""
        return exported_format(self.weights) is not None

    def __repr__(self) -> str:
        what = self.weights or ("random weights" if self.random_weights else "no weights")
        return f"YOLOX({what}, exp={getattr(self.exp, 'exp_name', None)})"

    # ------------------------------------------------------------------ predict
    def predictor(self) -> Predictor:
        """The Predictor `predict` runs (built on first use: BatchNorm folded, the exp's memory layout)."""
        if self._predictor is None:
            if self.exported:
                model = load_exported_model(self.weights, self.device)
                meta = model.metadata
                self._predictor = Predictor(
                    model, meta.num_classes, meta.test_size, DEMO_CONF, DEMO_NMS, model.device
                )
                self._class_names = meta.class_names
            else:
                exp = copy.copy(self.exp)  # the caller's exp object keeps its fields and its model unfused
                exp.model = None
                exp.resolve_num_classes(self.weights)
                model, self._class_names = load_inference_model(
                    exp, self.weights, self.device, fuse=True, random_weights=self.random_weights
                )
                self._predictor = Predictor(
                    model,
                    exp.num_classes,
                    exp.test_size,
                    DEMO_CONF,
                    DEMO_NMS,
                    self.device,
                    channels_last=exp.channels_last,
                )
        return self._predictor

    @property
    def names(self) -> tuple[str, ...]:
        """The model's class names, by class id."""
        self.predictor()
        return self._class_names

    def predict(
        self,
        sources: Any,
        conf: float = DEMO_CONF,
        iou: float = DEMO_NMS,
        batch: int = 1,
        color: str = "bgr",
        per_class_nms: bool = False,
        recursive: bool = False,
    ) -> list[Results]:
        """Detect objects in `sources`: a path (image, folder, glob pattern), a PIL image or an array
        (H, W, 3) uint8 in `color` order ("bgr" as OpenCV reads, or "rgb"), or a list of these. A folder
        gives its own images, and with `recursive` those of its subfolders too. `conf`: score threshold,
        `iou`: NMS IoU threshold (across classes, one box per object, unless `per_class_nms`), `batch`:
        images per forward. Returns one Results per image, in order, boxes in its own pixels."""
        return list(self.predict_stream(sources, conf, iou, batch, color, per_class_nms, recursive))

    def predict_stream(
        self,
        sources: Any,
        conf: float = DEMO_CONF,
        iou: float = DEMO_NMS,
        batch: int = 1,
        color: str = "bgr",
        per_class_nms: bool = False,
        recursive: bool = False,
    ) -> Iterator[Results]:
        """`predict` one batch at a time: for folders too large to hold every image and result at once."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        predictor = self.predictor()
        predictor.conf, predictor.nms, predictor.class_agnostic = conf, iou, not per_class_nms
        chunk: list[tuple[str | None, Any]] = []
        for item in read_sources(sources, color, recursive):
            chunk.append(item)
            if len(chunk) == batch:
                yield from self._detect(predictor, chunk)
                chunk = []
        if chunk:
            yield from self._detect(predictor, chunk)

    def _detect(self, predictor: Predictor, chunk: Sequence[tuple[str | None, Any]]) -> list[Results]:
        detections = predictor.predict([image for _, image in chunk])
        return [
            Results.from_detections(dets, self._class_names, image, name)
            for (name, image), dets in zip(chunk, detections)
        ]

    # ------------------------------------------------------------------ validate, train, export
    def val(
        self,
        data: str | None = None,
        batch: int = 16,
        conf: float | None = None,
        iou: float | None = None,
        **overrides: Any,
    ):
        """Evaluate on the validation split of `data` (a dataset description, data.yaml, folder or built-in
        name; default: the exp's dataset), as `yolox_fast eval` does, in this process. `conf` / `iou`: the
        exp's test_conf / nmsthre unless given; `overrides`: exp fields (`test_size=(320, 320)`). Returns
        the metrics (`EvalMetrics`: ap50_95, ap50, per_class {name: {"AP50_95", "AP50"}}, summary); the
        report files go where the tool writes them."""
        from yolox_fast.tools import eval as eval_tool

        if self.weights is None:
            raise ValueError(f"{NO_WEIGHTS}; validating random weights measures nothing")
        argv = ["-c", self.weights, "-b", str(batch)]
        argv += ["--conf", str(conf)] if conf is not None else []
        argv += ["--nms", str(iou)] if iou is not None else []
        args = parse_with_overrides(eval_tool.make_parser(), argv + _override_words(data, overrides))
        return eval_tool.evaluate(args, None if self.exported else self.exp)

    def train(
        self, data: str | None = None, epochs: int | None = None, batch: int | None = None, **overrides: Any
    ) -> str:
        """Train on `data` (default: the exp's dataset) for `epochs` (default: the exp's max_epoch) at total
        batch `batch` (default: the exp's), in this one process, as `yolox_fast train` does; `overrides` are
        exp fields (`input_size=(320, 320)`, `output_dir="runs"`). With weights, training starts from them
        (a fine-tune). Returns the best checkpoint's path; this object then predicts, validates and exports
        with it. Multi-process training is the command line's (`yolox_fast train -d K`, torchrun)."""
        from yolox_fast.core.cli import build_exp
        from yolox_fast.core.trainer import run_training
        from yolox_fast.tools import train as train_tool

        if self.exported:
            raise ValueError(f"{self.weights} is an exported file: train from a checkpoint or an exp")
        fields = {**overrides, **({"max_epoch": epochs} if epochs is not None else {})}
        argv = ["-c", self.weights] if self.weights else []
        argv += ["-b", str(batch)] if batch is not None else []
        args = train_tool.parse_args(argv + _override_words(data, fields), exp=self.exp)
        trained = build_exp(args, exp=self.exp)
        run_training(args, exp=self.exp)
        run_dir = Path(trained.output_dir) / args.experiment_name
        best = run_dir / "best_ckpt.pth"
        self.weights = str(best if best.is_file() else run_dir / "latest_ckpt.pth")
        self.exp = trained
        self._predictor = None
        return self.weights

    def export(self, format: str = "onnx", **flags: Any) -> str:
        """Export to `format` ("onnx", "openvino", "torchscript", "tensorrt") as `yolox_fast export` does;
        `flags` are its flags by name (`dynamic=True`, `int8=True`, `output_name="m.onnx"`, `batch_size=4`).
        Returns the written file's path."""
        from yolox_fast.tools import export as export_tool

        if self.exported:
            raise ValueError(f"{self.weights} is already an exported file: export its checkpoint")
        if self.weights is None and not self.random_weights:
            raise ValueError(NO_WEIGHTS)
        argv = ["--format", format] + (["-c", self.weights] if self.weights else ["--random-weights"])
        for name, value in flags.items():
            flag = "--" + name.replace("_", "-")
            if value is True:
                argv.append(flag)
            elif value is not False and value is not None:
                argv += [flag, str(value)]
        return export_tool.main(argv, exp=self.exp)


def _exp_of(source: str) -> BaseExp:
    """An exp file (.py) or an exp name."""
    if source.endswith(".py") or os.path.isfile(source):
        return get_exp_by_file(source)
    return get_exp_by_name(source)


def _checkpoint_exp(path: str) -> BaseExp | None:
    """The exp a checkpoint of ours stores, or None for official weights (then `exp` must be given)."""
    try:
        return get_exp_by_checkpoint(path)
    except ValueError:
        return None


def _override_words(data: str | None, fields: dict[str, Any]) -> list[str]:
    """KEY VALUE words of the command line for `data` (the exp's dataset) and exp `fields`."""
    words = ["dataset", str(data)] if data is not None else []
    for key, value in fields.items():
        words += [key, "none" if value is None else str(value)]
    return words
