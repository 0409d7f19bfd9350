"""Experiment trackers: where a run's metrics, pictures and checkpoints go besides its output folder.

`-l tensorboard` (the default), `-l wandb`, `-l mlflow`, several at once (`-l tensorboard,mlflow`) or
`-l none`, with YOLOX's option names. One small class per backend behind one interface (`Tracker`); the
trainer talks to `Trackers`, the group of the chosen ones, and only on rank 0 (the other ranks get an empty
group). What every tracker receives:

    train/lr, train/<loss>     at the global optimizer step (`progress_in_iter + 1`, 1-based)
    val/AP50_95, val/AP50      at the 1-based epoch
    train_batch/<phase>        a few augmented training images with their boxes (step as TensorBoard's)
    val/<picture>              the evaluation pictures (confusion matrices, PR and F1 curves), at the epoch
    val/detections             (W&B) validation images with their detections and ground truth boxes
    checkpoints                (W&B with wandb-log_checkpoints true, MLflow by default)

Options, on the command line as trailing words among the exp's KEY VALUE overrides (taken out before the exp
sees them, `split_options`), or environment variables as YOLOX reads them:

    W&B     wandb-project, wandb-name, wandb-id, wandb-entity, wandb-save_dir (default: $WANDB_DIR, else the
            output folder), wandb-log_checkpoints (bool), wandb-num_eval_images (YOLOX spells it
            wandb-num_eval_imges; both work; -1: all), any other wandb-X is passed to wandb.init as X
    MLflow  mlflow-tracking_uri / MLFLOW_TRACKING_URI, mlflow-experiment_name / MLFLOW_EXPERIMENT_NAME,
            mlflow-run_name / YOLOX_MLFLOW_RUN_NAME, YOLOX_MLFLOW_LOG_MODEL_ARTIFACTS (default true here),
            YOLOX_MLFLOW_LOG_MODEL_PER_n_EPOCHS (30), YOLOX_MLFLOW_LOG_Nth_EPOCH_MODELS (false),
            YOLOX_MLFLOW_FLATTEN_PARAMS (false), MLFLOW_TAGS (JSON), MLFLOW_RUN_ID

A resumed run continues the same W&B and MLflow run: their ids travel in the checkpoint ("tracker_runs"),
and the resumed trainer logs only the steps after the checkpoint's position. A run killed without a
checkpoint at its last step (kill -9, a crashed node) repeats the steps since its last checkpoint: MLflow
skips the steps its run already holds, TensorBoard hides the earlier attempt's (purge_step); W&B offline
cannot look its run up and logs them again.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from loguru import logger

from yolox_fast.exp.fields import FALSE_WORDS, TRUE_WORDS

TRACKERS = ("tensorboard", "wandb", "mlflow")
DEFAULT_EVAL_IMAGES = 16  # W&B validation images with detections per evaluation (YOLOX's default is 100)
MLFLOW_OPTIONS = ("tracking_uri", "experiment_name", "run_name")
WANDB_OPTIONS = ("project", "name", "id", "entity", "save_dir", "log_checkpoints", "num_eval_images")


def parse_logger(value: str) -> tuple[str, ...]:
    """The `-l` value as tracker names: "tensorboard,mlflow" -> ("tensorboard", "mlflow"); "none" -> ()."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in value.split(",") if n.strip()))
    if names == ("none",):
        return ()
    bad = [n for n in names if n not in TRACKERS]
    if not names or bad or "none" in names:
        raise argparse.ArgumentTypeError(
            f"{value!r}: choose tensorboard, wandb, mlflow, several joined by commas "
            "(tensorboard,mlflow), or none"
        )
    return names


def split_options(opts: Sequence[str]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Trailing KEY VALUE words -> (the exp's overrides, {"wandb": {...}, "mlflow": {...}}): `wandb-project
    p` becomes {"wandb": {"project": "p"}}. An odd list is left whole to the exp (whose merge reports it)."""
    options: dict[str, dict[str, str]] = {"wandb": {}, "mlflow": {}}
    if len(opts) % 2:
        return list(opts), options
    rest = []
    for key, value in zip(opts[0::2], opts[1::2]):
        prefix, _, name = key.partition("-")
        if prefix in options and name:
            name = "num_eval_images" if name == "num_eval_imges" else name  # YOLOX's spelling
            options[prefix][name] = value
        else:
            rest += [key, value]
    return rest, options


def check(names: Sequence[str], options: Mapping[str, Mapping[str, str]]) -> None:
    """At start, before any work: every chosen tracker's package imports and its options are valid;
    otherwise one ValueError saying what to do (the tools print it as one `error:` line)."""
    for kind, given in options.items():
        if given and kind not in names:
            words = " ".join(f"{kind}-{k} {v}" for k, v in given.items())
            raise ValueError(f"{words}: {kind} options, but -l is {','.join(names) or 'none'}: add -l {kind}")
    for name in names:
        if name in ("wandb", "mlflow"):
            try:
                importlib.import_module(name)
            except ImportError as err:
                reason = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise ValueError(
                    f'-l {name} needs the {name} package: pip install "yolox_fast[{name}]" ({reason})'
                ) from None
    build(names, options)  # option values and environment variables are read and checked here


@dataclass
class RunStart:
    """What a tracker learns at the start of a run."""

    run_dir: str  # the output folder
    name: str  # the experiment name (-expn), the default W&B / MLflow run name
    config: dict[str, Any]  # the exp's fields and the command line's settings
    first_step: int  # the first train step (global optimizer step, 1-based) this process logs
    previous: dict[str, str] = field(default_factory=dict)  # "tracker_runs" of the checkpoint resumed from

    @property
    def resumed(self) -> bool:
        return self.first_step > 1


@dataclass
class EvalSample:
    """One validation image with what the model found (original pixels)."""

    image: np.ndarray  # (H, W, 3) uint8 RGB
    detections: np.ndarray  # (K, 6) x1, y1, x2, y2, score, class index
    truth_boxes: np.ndarray  # (M, 4) x1, y1, x2, y2
    truth_classes: np.ndarray  # (M,) class index


def eval_samples(evaluator, count: int) -> list[EvalSample]:
    """The first `count` (-1: all) validation images of the evaluator's last evaluation, by image id, with
    their detections and ground truth; [] on a rank that did not score."""
    from yolox_fast.evaluators.matching import ground_truth_of

    merged = getattr(evaluator, "last_merged", None)
    if merged is None or count == 0:
        return []
    dataset = evaluator.dataloader.dataset
    ids = sorted(merged.detections, key=str)
    ids = ids if count < 0 else ids[:count]
    index = {r.img_id: i for i, r in enumerate(dataset.records)}
    truths = ground_truth_of(dataset, ids)
    samples = []
    for img_id in ids:
        truth = truths[img_id]
        regular = truth.regular
        image = np.ascontiguousarray(dataset.load_image(index[img_id])[..., ::-1])  # BGR -> RGB
        dets = np.asarray(merged.detections[img_id], np.float64).reshape(-1, 6)
        samples.append(EvalSample(image, dets, truth.boxes[regular], truth.classes[regular]))
    return samples


class Tracker:
    """The interface; a backend overrides what it records. `run_id` is what a resume needs to continue the
    same run (None: nothing to continue)."""

    name = "none"
    run_id: str | None = None
    eval_images = 0  # validation images with detections this tracker wants per evaluation

    def start(self, run: RunStart) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_images(self, key: str, images: Sequence[np.ndarray], step: int) -> None:
        """`images`: (H, W, 3) uint8 RGB each, of one size."""

    def log_detections(
        self, samples: Sequence[EvalSample], class_names: Sequence[str], epoch: int
    ) -> None: ...

    def log_artifact(self, path: str, epoch: int, best: bool) -> None:
        """`path`: the checkpoint written at the end of 1-based `epoch` (latest_ckpt.pth), which is also the
        best so far when `best`."""

    def finish(self, status: str) -> None:
        """`status`: "FINISHED", "KILLED" (a signal: the run will resume) or "FAILED"."""


class TensorBoardTracker(Tracker):
    """Event files in `<output>/tensorboard/`."""

    name = "tensorboard"

    def start(self, run: RunStart) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run hides whatever an attempt killed after its last checkpoint logged from here on
        purge = run.first_step if run.resumed else None
        self.writer = SummaryWriter(os.path.join(run.run_dir, "tensorboard"), purge_step=purge)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_images(self, key: str, images: Sequence[np.ndarray], step: int) -> None:
        if len(images) == 1:
            self.writer.add_image(key, images[0], step, dataformats="HWC")
        else:
            self.writer.add_images(key, np.stack(images), step, dataformats="NHWC")

    def finish(self, status: str) -> None:
        self.writer.close()


def _axis(key: str) -> str:
    return "epoch" if key.startswith("val/") else "train/step"


class WandbTracker(Tracker):
    """A Weights & Biases run (`WANDB_MODE=offline` writes it to disk only; `wandb sync` uploads it)."""

    name = "wandb"

    def __init__(self, options: Mapping[str, str]) -> None:
        opts = dict(options)
        self.log_checkpoints = _bool(opts.pop("log_checkpoints", "false"), "wandb-log_checkpoints")
        count = opts.pop("num_eval_images", str(DEFAULT_EVAL_IMAGES))
        try:
            self.eval_images = int(count)
        except ValueError:
            raise ValueError(f"wandb-num_eval_images must be an integer (-1: all), got {count!r}") from None
        self.save_dir = opts.pop("save_dir", None)
        self.init_args = {k: _literal(v) if k not in WANDB_OPTIONS else v for k, v in opts.items()}

    def start(self, run: RunStart) -> None:
        import wandb

        args = dict(self.init_args)
        save_dir = self.save_dir or os.environ.get("WANDB_DIR") or run.run_dir
        os.makedirs(save_dir, exist_ok=True)
        self.run = wandb.init(
            project=args.pop("project", None),
            name=args.pop("name", run.name),
            id=args.pop("id", None) or run.previous.get("wandb"),
            entity=args.pop("entity", None),
            dir=save_dir,
            config=run.config,
            resume="allow",  # the same id continues that run
            allow_val_change=True,  # an extended run changes max_epoch
            **args,
        )
        self.run_id = self.run.id
        for axis in ("train/step", "epoch"):
            self.run.define_metric(axis, hidden=True)
        for pattern in ("train/*", "train_batch/*"):
            self.run.define_metric(pattern, step_metric="train/step")
        self.run.define_metric("val/*", step_metric="epoch")
        logger.info(f"W&B: run {self.run.id} ({'continued' if run.resumed else 'new'}), files in {save_dir}")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({**metrics, _axis(next(iter(metrics))): step})

    def log_images(self, key: str, images: Sequence[np.ndarray], step: int) -> None:
        import wandb

        self.run.log({key: [wandb.Image(img) for img in images], _axis(key): step})

    def log_detections(self, samples: Sequence[EvalSample], class_names: Sequence[str], epoch: int) -> None:
        import wandb

        labels = {i: str(n) for i, n in enumerate(class_names)}

        def boxes(rows, classes, scores=None):
            data = []
            for i, (x1, y1, x2, y2) in enumerate(np.asarray(rows, np.float64).reshape(-1, 4).tolist()):
                c = int(classes[i])
                item = {"position": {"minX": x1, "minY": y1, "maxX": x2, "maxY": y2}, "domain": "pixel"}
                item.update(class_id=c, box_caption=labels.get(c, str(c)))
                if scores is not None:
                    item["scores"] = {"score": float(scores[i])}
                    item["box_caption"] += f" {float(scores[i]):.2f}"
                data.append(item)
            return {"box_data": data, "class_labels": labels}

        images = [
            wandb.Image(
                s.image,
                boxes={
                    "predictions": boxes(s.detections[:, :4], s.detections[:, 5], s.detections[:, 4]),
                    "ground_truth": boxes(s.truth_boxes, s.truth_classes),
                },
            )
            for s in samples
        ]
        self.run.log({"val/detections": images, "epoch": epoch})

    def log_artifact(self, path: str, epoch: int, best: bool) -> None:
        if not self.log_checkpoints:
            return
        import wandb

        artifact = wandb.Artifact(f"run_{self.run.id}_model", type="model", metadata={"epoch": epoch})
        artifact.add_file(path, name="model_ckpt.pth")
        self.run.log_artifact(artifact, aliases=["latest", f"epoch-{epoch}", *(["best"] if best else [])])

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class MlflowTracker(Tracker):
    """An MLflow run, through `MlflowClient` with the run's id (no global active run): a tracking server,
    a SQLite database (`sqlite:///path/mlflow.db`) or whatever MLFLOW_TRACKING_URI names."""

    name = "mlflow"

    def __init__(self, options: Mapping[str, str]) -> None:
        unknown = sorted(set(options) - set(MLFLOW_OPTIONS))
        if unknown:
            raise ValueError(
                f"unknown MLflow option mlflow-{unknown[0]} (known: "
                + ", ".join(f"mlflow-{k}" for k in MLFLOW_OPTIONS)
                + ")"
            )
        env = os.environ
        self.tracking_uri = options.get("tracking_uri") or env.get("MLFLOW_TRACKING_URI") or None
        self.experiment = options.get("experiment_name") or env.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        self.run_name = options.get("run_name") or env.get("YOLOX_MLFLOW_RUN_NAME", "").strip() or None
        self.log_models = _bool(
            env.get("YOLOX_MLFLOW_LOG_MODEL_ARTIFACTS", "true"), "YOLOX_MLFLOW_LOG_MODEL_ARTIFACTS"
        )
        self.every_epochs = _positive(env.get("YOLOX_MLFLOW_LOG_MODEL_PER_n_EPOCHS", "30"))
        self.epoch_models = _bool(
            env.get("YOLOX_MLFLOW_LOG_Nth_EPOCH_MODELS", "false"), "YOLOX_MLFLOW_LOG_Nth_EPOCH_MODELS"
        )
        self.flatten = _bool(env.get("YOLOX_MLFLOW_FLATTEN_PARAMS", "false"), "YOLOX_MLFLOW_FLATTEN_PARAMS")
        try:
            self.tags = {str(k): str(v) for k, v in json.loads(env.get("MLFLOW_TAGS") or "{}").items()}
        except (ValueError, AttributeError):
            raise ValueError(f"MLFLOW_TAGS must be a JSON object, got {env['MLFLOW_TAGS']!r}") from None
        self.forced_run = env.get("MLFLOW_RUN_ID") or None
        self._last_step: dict[str, int] = {}  # metric -> the last step the run already holds (resume)

    def start(self, run: RunStart) -> None:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(self.tracking_uri)
        self.run_dir = run.run_dir
        run_id = self.forced_run or run.previous.get("mlflow")
        if run_id:
            try:
                self.client.update_run(run_id, status="RUNNING")
            except MlflowException as err:
                logger.warning(f"MLflow: cannot continue run {run_id} ({err}); starting a new run")
                run_id = None
        if run_id:
            self._last_step = self._logged_steps(run_id)
        else:
            experiment = self.client.get_experiment_by_name(self.experiment)
            exp_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(self.experiment)
            )
            run_id = self.client.create_run(exp_id, run_name=self.run_name or run.name).info.run_id
        self.run_id = run_id
        for key, value in self.tags.items():
            self.client.set_tag(run_id, key, value)
        self._log_params(run.config)
        where = self.client.tracking_uri
        logger.info(f"MLflow: run {run_id} ({'continued' if run.resumed else 'new'}) at {where}")

    def _logged_steps(self, run_id: str) -> dict[str, int]:
        last = {}
        for key in self.client.get_run(run_id).data.metrics:
            last[key] = max(m.step for m in self.client.get_metric_history(run_id, key))
        return last

    def _log_params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = {}
        for key, value in (_flatten(config) if self.flatten else config).items():
            text = str(value)
            if len(text) > MAX_PARAM_VAL_LENGTH:  # MLflow refuses longer values: keep their start
                logger.warning(
                    f"MLflow: param {key} is {len(text)} characters; logged its first {MAX_PARAM_VAL_LENGTH}"
                )
                text = text[:MAX_PARAM_VAL_LENGTH]
            params[key] = text
        held = self.client.get_run(self.run_id).data.params
        changed = {k: v for k, v in params.items() if k in held and held[k] != v}
        if changed:  # params cannot change in MLflow; a resume that changes one records it as a tag
            logger.warning(
                "MLflow: params are fixed once logged; the new values are in tags changed.<key>: "
                + ", ".join(f"{k} {held[k]} -> {v}" for k, v in changed.items())
            )
            for key, value in changed.items():
                self.client.set_tag(self.run_id, f"changed.{key}", value)
        new = [Param(k, v) for k, v in params.items() if k not in held]
        for i in range(0, len(new), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[i : i + MAX_PARAMS_TAGS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        fresh = [
            Metric(k, float(v), now, step) for k, v in metrics.items() if step > self._last_step.get(k, -1)
        ]
        if fresh:
            self.client.log_batch(self.run_id, metrics=fresh)

    def log_images(self, key: str, images: Sequence[np.ndarray], step: int) -> None:
        for i, img in enumerate(images):
            name = key if len(images) == 1 else f"{key}/{i}"
            self.client.log_image(self.run_id, np.ascontiguousarray(img), key=name, step=step)

    def log_artifact(self, path: str, epoch: int, best: bool) -> None:
        if self.log_models and epoch % self.every_epochs == 0:
            self._log_checkpoints(path, epoch)

    def _log_checkpoints(self, latest: str, epoch: int | None) -> None:
        folder = os.path.dirname(latest)
        files = [latest, os.path.join(folder, "best_ckpt.pth")]
        if self.epoch_models and epoch is not None:
            files.append(os.path.join(folder, f"epoch_{epoch}_ckpt.pth"))
        for path in files:
            if os.path.isfile(path):
                self.client.log_artifact(self.run_id, path, "checkpoints")

    def finish(self, status: str) -> None:
        if status == "FINISHED":  # a stopped run leaves its uploads to the run that resumes it
            if self.log_models:
                self._log_checkpoints(os.path.join(self.run_dir, "latest_ckpt.pth"), None)
            for name in ("train_log.txt", "results.csv", "results.png"):
                path = os.path.join(self.run_dir, name)
                if os.path.isfile(path):
                    self.client.log_artifact(self.run_id, path)
        self.client.set_terminated(self.run_id, status)


class Trackers:
    """The chosen trackers, called as one. A tracker whose call fails after the start (a server gone away
    mid-run) is dropped with a warning: a run of days is not ended by its logging."""

    def __init__(self, trackers: Sequence[Tracker] = ()) -> None:
        self.trackers = list(trackers)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    @property
    def eval_images(self) -> int:
        """The most validation images with detections any tracker wants (-1: all)."""
        counts = [t.eval_images for t in self.trackers]
        return -1 if -1 in counts else max(counts, default=0)

    def run_ids(self) -> dict[str, str]:
        """{tracker name: run id} for the checkpoint ("tracker_runs"): what a resume continues."""
        return {t.name: t.run_id for t in self.trackers if t.run_id}

    def start(self, run: RunStart) -> None:
        for tracker in self.trackers:
            tracker.start(run)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._each("log_metrics", metrics, step)

    def log_images(self, key: str, images: Sequence[np.ndarray], step: int) -> None:
        self._each("log_images", key, images, step)

    def log_detections(self, samples: Sequence[EvalSample], class_names: Sequence[str], epoch: int) -> None:
        self._each("log_detections", samples, class_names, epoch)

    def log_artifact(self, path: str, epoch: int, best: bool) -> None:
        self._each("log_artifact", path, epoch, best)

    def finish(self, status: str) -> None:
        self._each("finish", status)

    def _each(self, method: str, *args) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as err:  # noqa: BLE001 -- logging must not end training
                logger.warning(
                    f"{tracker.name}: {method} failed ({type(err).__name__}: {err}); "
                    f"training goes on without {tracker.name}"
                )
                self.trackers.remove(tracker)


def build(names: Sequence[str], options: Mapping[str, Mapping[str, str]]) -> Trackers:
    """The trackers of `-l` (`parse_logger`'s names) with their options (`split_options`)."""
    made: list[Tracker] = []
    for name in names:
        if name == "tensorboard":
            made.append(TensorBoardTracker())
        elif name == "wandb":
            made.append(WandbTracker(options.get("wandb", {})))
        else:
            made.append(MlflowTracker(options.get("mlflow", {})))
    return Trackers(made)


def _bool(text: str, name: str) -> bool:
    word = str(text).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{name} must be true or false, got {text!r}")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"YOLOX_MLFLOW_LOG_MODEL_PER_n_EPOCHS must be a positive integer, got {text!r}")
    return value


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1} (YOLOX_MLFLOW_FLATTEN_PARAMS)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
