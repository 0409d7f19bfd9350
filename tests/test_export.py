"""Export to ONNX, TorchScript and OpenVINO: the file carries its metadata and, run as eval and the demo
run it, gives PyTorch's outputs (raw or decoded, static or dynamic batch; fp16 and INT8 close to them);
eval and the demo take the exported file as -c with the checkpoint's AP; bad files and flags end the tools
with one `error:` line."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import load_tool, run_tool_here, run_tool_process

from yolox_fast.core.cli import run_tool
from yolox_fast.data.build import build_calibration_dataset, build_eval_dataset
from yolox_fast.exp import get_exp
from yolox_fast.export import (
    FORMATS,
    CalibrationImages,
    ExportedModel,
    ExportMetadata,
    MissingExtraError,
    export_file,
    export_metadata,
    exported_format,
    exported_size,
    load_exported_model,
    output_diff,
    require,
)
from yolox_fast.export.onnx import export_onnx, export_onnx_int8
from yolox_fast.export.openvino import export_openvino
from yolox_fast.export.torchscript import export_torchscript

pytest.importorskip("onnxruntime")
REPO = Path(__file__).resolve().parents[1]
SHAPES_EXP = str(REPO / "exps" / "example" / "shapes_nano.py")
AP_LINE = re.compile(r"AP50:95 (\d\.\d{4})  AP50 (\d\.\d{4})")


def _nano(num_classes=3, test_size=(64, 96), dataset="shapes"):
    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes, exp.test_size, exp.dataset = num_classes, test_size, dataset
    torch.manual_seed(0)
    return exp, exp.get_model().eval()


def _lively_nano(dataset: str, size: int):
    """(exp, model) of a random-weight nano whose outputs vary with the image as a trained one's do: the
    BatchNorm statistics of the training images (a fresh model's features fade to constants layer by
    layer) and a damped head (its outputs then spread over (0, 1), boxes mostly image-sized). No training,
    so it takes a second."""
    exp, model = _nano(6, (size, size), dataset)
    images = torch.stack([torch.from_numpy(item[0]) for item in build_calibration_dataset(exp)])
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.train()
                module.momentum = None  # a plain average over the batch
                module.reset_running_stats()
        model(images)
        model.eval()
        for conv in [*model.head.obj_preds, *model.head.cls_preds, *model.head.reg_preds]:
            conv.bias.zero_()
            conv.weight.mul_(0.05)
    return exp, model


def _images(batch, size=(64, 96), seed=1):
    return torch.rand(batch, 3, *size, generator=torch.Generator().manual_seed(seed)) * 255


def test_dynamic_onnx_raw_outputs_are_decoded_by_the_runtime(tmp_path):
    exp, model = _nano()
    path = str(tmp_path / "nano.onnx")
    meta = export_metadata(exp, model, ["a", "b", "c"], "onnx", decode_in_graph=False, batch_size=None)
    export_onnx(model, path, meta, batch_size=1)
    assert model.head.decode_in_inference is True  # the export restores the model's own setting
    exported = load_exported_model(path)
    assert exported.metadata == meta
    abs_diff, _ = output_diff(model, exported, _images(3))  # a batch of 3, not the traced 1
    assert abs_diff < 1e-3  # decoded pixels (exp of the raw wh) on both sides


def test_static_onnx_graph_is_fed_chunks_of_its_batch_the_last_padded(tmp_path):
    exp, model = _nano()
    path = str(tmp_path / "static.onnx")
    meta = export_metadata(exp, model, ["a", "b", "c"], "onnx", decode_in_graph=True, batch_size=2)
    export_onnx(model, path, meta, batch_size=2)
    exported = load_exported_model(path)
    images = _images(5)  # chunks of 2, 2 and 1 padded to 2
    assert exported(images).shape == (5, 8 * 12 + 4 * 6 + 2 * 3, 5 + 3)
    assert output_diff(model, exported, images)[0] < 1e-3
    with pytest.raises(ValueError, match=r"takes input \(B, 3, 64, 96\)"):
        exported(_images(1, (64, 64)))


def test_torchscript_round_trip_any_batch_and_metadata_inside(tmp_path):
    exp, model = _nano()
    path = str(tmp_path / "nano.torchscript")
    meta = export_metadata(exp, model, ["a", "b", "c"], "torchscript", decode_in_graph=False, batch_size=None)
    export_torchscript(model, path, meta)
    exported = load_exported_model(path)
    assert exported.metadata == meta and exported.metadata.strides == (8, 16, 32)
    assert output_diff(model, exported, _images(3))[0] < 1e-3


def test_openvino_fp32_equals_pytorch_and_fp16_weights_stay_close(tmp_path):
    exp, model = _nano()
    images = _images(3)
    for precision, bound in (("fp32", 1e-3), ("fp16", 5e-3)):
        path = str(tmp_path / f"nano_{precision}.xml")
        meta = export_metadata(exp, model, ["a", "b", "c"], "openvino", False, None, precision)
        export_openvino(model, path, meta)
        exported = load_exported_model(path)
        assert exported.metadata == meta
        # fp32 files compute in fp32 even where the CPU plugin would pick bf16
        assert exported.runs_in == "fp32" or precision == "fp16"
        _, relative = output_diff(model, exported, images)
        assert relative < bound, (precision, relative)
    # the .bin beside the .xml holds the weights: fp16 halves it
    half, full = (
        exported_size(str(tmp_path / "nano_fp16.xml")),
        exported_size(str(tmp_path / "nano_fp32.xml")),
    )
    assert 0.4 < half / full < 0.6


def _scores(out: torch.Tensor) -> torch.Tensor:
    """obj x cls of decoded outputs (B, A, 5 + C): the confidences NMS thresholds."""
    return out[..., 4:5] * out[..., 5:]


@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_int8_is_calibrated_on_the_training_images_and_scores_stay_close(fmt, tiny_shapes_coco, tmp_path):
    exp, model = _lively_nano(tiny_shapes_coco["config"], 96)
    calibration = CalibrationImages(build_calibration_dataset(exp), 300, 1)
    assert calibration.num_images == tiny_shapes_coco["num_train"]  # fewer than asked: all of them
    path = str(tmp_path / f"int8.{'xml' if fmt == 'openvino' else 'onnx'}")
    meta = export_metadata(exp, model, [str(i) for i in range(6)], fmt, False, None, "int8", "cpu", 24)
    if fmt == "onnx":
        export_onnx_int8(model, path, meta, calibration)
    else:
        export_openvino(model, path, meta, calibration=calibration)
    exported = load_exported_model(path)
    assert exported.metadata.precision == "int8" and exported.metadata.calibration_images == 24
    val = build_eval_dataset(exp)
    images = torch.stack([torch.from_numpy(val[i][0]) for i in range(len(val))])
    with torch.no_grad():
        reference = model(images)
    # activation ranges measured on real images keep the confidences within a few hundredths
    assert (_scores(exported(images)) - _scores(reference)).abs().mean() < 0.02
    fp32 = str(tmp_path / "fp32.onnx")
    export_onnx(model, fp32, export_metadata(exp, model, [str(i) for i in range(6)], "onnx", False, None))
    assert exported_size(path) < 0.5 * exported_size(fp32)


def test_openvino_int8_ranges_span_every_calibration_image_not_their_average(tmp_path):
    """NNCF's default averages each calibration batch's extremes; at batch 1 the one image with a larger
    activation (a bright photo; an object's peak in the head) is then clipped to the others' level."""
    exp, model = _nano(3, (96, 96))
    rng = np.random.default_rng(0)
    dim = [(rng.uniform(0, 100, (3, 96, 96)).astype(np.float32),) for _ in range(7)]
    bright = [(np.full((3, 96, 96), 255.0, np.float32),)]
    path = str(tmp_path / "int8.xml")
    meta = export_metadata(exp, model, ["a", "b", "c"], "openvino", False, None, "int8", "cpu", 8)
    export_openvino(model, path, meta, calibration=CalibrationImages(bright + dim, 8, 1))
    import openvino as ov

    input_highs = [  # the quantizer on the input image (the stem convolves the image itself)
        float(op.input_value(2).get_node().get_data().max())
        for op in ov.Core().read_model(path).get_ordered_ops()
        if op.get_type_name() == "FakeQuantize"
        and op.input_value(0).get_node().get_type_name() == "Parameter"
    ]
    assert input_highs and min(input_highs) > 250, input_highs  # the average of the maxima: ~120


def test_calibration_needs_a_full_batch_of_training_images(tiny_shapes_coco):
    exp, _ = _nano(6, (64, 64), tiny_shapes_coco["config"])
    dataset = build_calibration_dataset(exp)
    assert CalibrationImages(dataset, 10, 4).num_images == 8  # whole batches of the graph's batch size
    with pytest.raises(ValueError, match="at least 32 training images"):
        CalibrationImages(dataset, 300, 32)
    # OpenVINO's INT8 kernels segfault on a 2x2 coarsest level: refused before they run
    _, model = _nano(6, (64, 64), tiny_shapes_coco["config"])
    meta = export_metadata(exp, model, [str(i) for i in range(6)], "openvino", False, None, "int8")
    with pytest.raises(ValueError, match="2x2 coarsest level"):
        export_openvino(model, "unused.xml", meta, calibration=CalibrationImages(dataset, 4, 1))


def test_fp16_torchscript_is_refused_off_cuda(tmp_path):
    exp, model = _nano()
    meta = export_metadata(exp, model, ["a", "b", "c"], "torchscript", False, None, precision="fp16")
    with pytest.raises(ValueError, match="CUDA only"):
        export_torchscript(model, str(tmp_path / "half.torchscript"), meta, "cpu")


def test_the_export_package_is_one_module_per_format_and_what_they_share():
    modules = {path.stem for path in (REPO / "yolox_fast" / "export").glob("*.py")}
    assert modules - {"__init__", "common", "formats", "graph_nms"} == set(FORMATS)
    assert load_tool("export").make_parser()._option_string_actions["--format"].choices == tuple(FORMATS)
    extras = (REPO / "setup.py").read_text()
    assert all(f'"{row.extra}": [' in extras for row in FORMATS.values() if row.extra)


@pytest.mark.parametrize("name", list(FORMATS))
def test_a_files_format_writer_and_runner_come_from_its_row_of_the_table(name, tmp_path, monkeypatch):
    row = FORMATS[name]
    assert row.write.__module__ == row.load.__module__ == f"yolox_fast.export.{name}"
    path = tmp_path / f"model{row.suffix.upper()}"  # the suffix in any case
    assert exported_format(str(path)) == name
    meta = ExportMetadata(
        name, ("a",), 1, (64, 64), (8, 16, 32), False, None, "fp32", "cpu", 0.01, 0.65, "x", "shapes", None
    )
    written, opened = [], []
    stand_in = dataclasses.replace(
        row,
        write=lambda model, path, metadata, *rest: written.append((path, metadata.format)),
        load=lambda path, device: opened.append(path) or ExportedModel(path, meta, None, device),
    )
    monkeypatch.setitem(FORMATS, name, stand_in)
    export_file(None, str(path), meta)
    assert written == [(str(path), name)]
    path.write_bytes(b"model")
    assert load_exported_model(str(path)).metadata == meta and opened == [str(path)]


def test_export_onnx_tool_static_decoded_writes_metadata(tmp_path, capsys):
    out = tmp_path / "decoded.onnx"
    argv = ["-n", "yolox-nano", "--random-weights", "--tsize", "64", "--batch-size", "2"]
    argv.append("--decode-in-inference")
    load_tool("export_onnx").main([*argv, "--output-name", str(out), "num_classes", "2"])
    printed = capsys.readouterr().out
    diff = float(printed.split("max abs diff:")[1].split()[0])
    assert diff < 1e-3  # decoded boxes are in pixels (exp of the raw wh), so the absolute error is larger
    meta = load_exported_model(str(out)).metadata
    assert (meta.batch_size, meta.decode_in_graph, meta.test_size, meta.num_classes) == (2, True, (64, 64), 2)
    assert len(meta.class_names) == 2


@pytest.fixture(scope="module")
def random_onnx(tmp_path_factory, tiny_shapes_coco):
    """An ONNX export (static batch 2) of a random-weight nano on the tiny set's 6 classes at 64 px."""
    exp, model = _nano(6, (64, 64), tiny_shapes_coco["config"])
    path = str(tmp_path_factory.mktemp("onnx") / "random.onnx")
    export_onnx(model, path, export_metadata(exp, model, [str(i) for i in range(6)], "onnx", False, 2), 2)
    return path


def _error_line(tool: str, argv: list, capsys) -> str:
    """The tool run as its __main__ runs it; asserts it ended with exit code 1 and one `error:` line."""
    module = load_tool(tool)
    with pytest.raises(SystemExit) as stop:
        run_tool(lambda: module.main(argv))
    assert stop.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_bad_exported_files_and_flags_are_one_error_line(random_onnx, tmp_path, capsys):
    renamed = tmp_path / "weights.onnx"
    torch.save({"model": {"w": torch.zeros(1)}}, renamed)  # a checkpoint given an exported file's name
    assert "PyTorch checkpoint, not an exported model" in _error_line("eval", ["-c", str(renamed)], capsys)
    garbage = tmp_path / "garbage.torchscript"
    garbage.write_bytes(b"not a model")
    assert "is not a TorchScript file" in _error_line("eval", ["-c", str(garbage)], capsys)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07garbage")
    assert "is not an ONNX model" in _error_line("demo", ["image", "-c", str(broken)], capsys)

    onnx = pytest.importorskip("onnx")
    graph = onnx.load(random_onnx)
    del graph.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(graph, str(bare))
    assert "carries no yolox_fast metadata" in _error_line("eval", ["-c", str(bare)], capsys)

    line = _error_line("eval", ["-c", random_onnx, "--tsize", "96"], capsys)
    assert "--tsize 96 does not match" in line and "(64, 64)" in line
    assert "fixed at export" in _error_line("eval", ["-c", random_onnx, "--fp16"], capsys)
    line = _error_line("export", ["--format", "torchscript", "-n", "yolox-nano", "--half"], capsys)
    assert "CUDA only" in line
    line = _error_line("export", ["--format", "onnx", "-n", "yolox-nano", "--half"], capsys)
    assert "no fp16 convolutions" in line and "--int8" in line
    ir = tmp_path / "model.xml"
    ir.write_text("<net></net>")
    assert "no model.bin beside it" in _error_line("eval", ["-c", str(ir)], capsys)
    ir.with_suffix(".bin").write_bytes(b"\0" * 8)
    assert "is not an OpenVINO IR" in _error_line("demo", ["image", "-c", str(ir)], capsys)
    if not torch.cuda.is_available():  # the TensorRT path itself runs in tools/gpu_check.sh
        line = _error_line("export", ["--format", "tensorrt", "-n", "yolox-nano"], capsys)
        assert "NVIDIA GPU" in line and "no CUDA here" in line
        engine = tmp_path / "model.engine"
        engine.write_bytes(b"plan")
        assert "runs on an NVIDIA GPU" in _error_line("eval", ["-c", str(engine)], capsys)


def test_missing_runtime_names_the_extra(monkeypatch, random_onnx, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    with pytest.raises(MissingExtraError, match=r'pip install "yolox_fast\[onnx\]"'):
        require("onnxruntime", "onnx")
    assert 'pip install "yolox_fast[onnx]"' in _error_line("eval", ["-c", random_onnx], capsys)


def _printed_ap(out: str) -> tuple[float, float]:
    """The (AP50:95, AP50) line eval printed."""
    found = AP_LINE.findall(out)
    assert found, out[-3000:]
    return float(found[-1][0]), float(found[-1][1])


def _unmatched(expected: list[dict], got: list[dict], score_tol: float, px_tol: float) -> list[dict]:
    """The rows of `expected` that `got` lacks (rows: "image_id", "category_id", "bbox", "score"). Near-equal
    scores may come out in another order, so each row is matched to the row of `got` of the same image and
    class, within `score_tol` in score, whose box is closest, and counts when every bbox value is within
    `px_tol`; each row of `got` is used once."""
    pool: dict[tuple, list[dict]] = {}
    for row in got:
        pool.setdefault((row["image_id"], row["category_id"]), []).append(row)
    missing = []
    for row in expected:
        left = pool.get((row["image_id"], row["category_id"]), [])
        same = [other for other in left if abs(other["score"] - row["score"]) <= score_tol]
        if not same:
            missing.append(row)
            continue
        closest = min(same, key=lambda other: sum(abs(a - b) for a, b in zip(other["bbox"], row["bbox"])))
        if max(abs(a - b) for a, b in zip(closest["bbox"], row["bbox"])) <= px_tol:
            left.remove(closest)
        else:
            missing.append(row)
    return missing


@pytest.mark.slow
def test_exported_files_score_the_checkpoints_detections_and_the_demo_draws_with_onnx(
    tiny_shapes_coco, tmp_path
):
    """Every format, run by `tools/eval.py -c FILE` as typed, gives the checkpoint's detections, hence its AP.
    A lively random model, not a trained one: scores spread over (0, 1) keep the ranking and NMS stable under
    the runtimes' fp32 rounding, which differs with the CPU. A model trained in the seconds a test has (24
    images, 180 steps) saturates: scores of exactly 1.0 on boxes of 1e30 px, whose order rounding decides,
    so ONNX Runtime on an AVX-512 EPYC scored twice the AP50 of PyTorch and OpenVINO, which agreed."""
    data = ["dataset", tiny_shapes_coco["config"], "output_dir", str(tmp_path), "data_num_workers", "0"]
    # 96 px: OpenVINO INT8 needs a coarsest level of 3x3 cells
    exp, model = _lively_nano(tiny_shapes_coco["config"], 96)
    with torch.no_grad():
        for conv in model.head.reg_preds:  # boxes of twice the stride: some cover a shape, the AP is not 0
            conv.bias.copy_(torch.tensor([0.0, 0.0, np.log(2.0), np.log(2.0)]))
    ckpt = str(tmp_path / "lively.pth")
    torch.save({"model": model.state_dict()}, ckpt)

    export = load_tool("export")
    files = {
        "onnx": ["--format", "onnx", "--batch-size", "2"],  # static batch 2
        "torchscript": ["--format", "torchscript", "--decode-in-inference"],
        "xml": ["--format", "openvino", "--dynamic"],
        "fp16.xml": ["--format", "openvino", "--dynamic", "--half"],
        "int8.xml": ["--format", "openvino", "--dynamic", "--int8"],
        "int8.onnx": ["--format", "onnx", "--dynamic", "--int8"],
    }
    tiny = ["--tsize", "96", "input_size", "(96,96)", "random_size", "(3,3)"]
    base = ["-f", SHAPES_EXP, "-expn", "run", "-c", ckpt, "--no-check", *tiny, *data]
    for suffix, flags in files.items():
        export.main([*flags, "--output-name", str(tmp_path / f"model.{suffix}"), *base])

    # -b 3 on the static batch-2 graph: chunks of 2, the last one padded
    flags = ["-b", "3", "--conf", "0.001"]
    # the checkpoint's detections and AP from `python tools/eval.py` as a user types it
    typed = ["-f", SHAPES_EXP, "-expn", "run", "-c", ckpt, *flags, *tiny, *data]
    reference = _printed_ap(run_tool_process("eval", *typed, "--save-dir", "ckpt", cwd=tmp_path))
    expected = json.loads((tmp_path / "ckpt" / "detections.json").read_text())
    assert reference[1] > 0 and len(expected) > 1000, reference  # every anchor's box, some of them right
    for suffix in files:  # no -f: data, size, classes and thresholds come from the file
        # as typed too, in this process: six more interpreter starts would only add their imports
        done = run_tool_here(
            "eval", "-c", tmp_path / f"model.{suffix}", *flags, "--save-dir", suffix, "data_num_workers", 0,
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads((tmp_path / suffix / "detections.json").read_text())
        if "fp16" in suffix or "int8" in suffix:
            # reduced precision: this random model's boxes amplify its rounding (fp16 moves some by tens of
            # px), so here only that eval runs it on every image; how close its outputs stay is the INT8
            # and fp16 tests' above, on the outputs themselves
            assert {row["image_id"] for row in got} == {row["image_id"] for row in expected}, suffix
        else:
            # fp32: every box within fp32 rounding (2e-4 in score, 0.05 px), the AP as printed
            assert len(got) == len(expected) and not _unmatched(expected, got, 2e-4, 0.05), suffix
            scored = _printed_ap(done.stderr)
            assert scored == pytest.approx(reference, abs=1e-4), (suffix, reference, scored)

    # the demo draws with the INT8 OpenVINO file, classes named from its metadata
    demo = load_tool("demo")
    images = Path(tiny_shapes_coco["root"]) / "val2017"
    shown = ["--path", str(images), "-b", "3", "--conf", "0.05", "--save_result", "--save-json"]
    demo.main(["image", "-c", str(tmp_path / "model.int8.xml"), *shown, *data])
    (saved,) = (tmp_path / "run" / "vis_res").glob("*/detections.json")
    drawn = json.loads(saved.read_text())
    assert len(drawn) == tiny_shapes_coco["num_val"] and len(list(saved.parent.glob("*.jpg"))) == len(drawn)
    names = {d["class_name"] for dets in drawn.values() for d in dets}
    assert names and names <= {"circle", "square", "triangle", "star", "cross", "ring"}


def test_demo_with_an_exported_file_draws_the_checkpoints_boxes(tiny_shapes_coco, tmp_path):
    """A lively random model (moderate boxes and spread scores, where NMS decides the same on both sides; an
    almost untrained model's 1e16 px boxes and saturated scores make its suppression hinge on rounding)."""
    exp, model = _lively_nano(tiny_shapes_coco["config"], 64)
    ckpt = tmp_path / "random.pth"
    torch.save({"model": model.state_dict()}, ckpt)
    onnx = str(tmp_path / "random.onnx")
    names = ["circle", "square", "triangle", "star", "cross", "ring"]
    export_onnx(model, onnx, export_metadata(exp, model, names, "onnx", False, None))
    demo = load_tool("demo")
    images = Path(tiny_shapes_coco["root"]) / "val2017"
    shown = ["--path", str(images), "-b", "3", "--conf", "0.2", "--save-json", "output_dir", str(tmp_path)]
    demo.main(["image", "-c", onnx, "-expn", "onnx", *shown])
    demo.main(["image", "-n", "yolox-nano", "-c", str(ckpt), "--tsize", "64", "-expn", "torch", *shown,
               "num_classes", "6", "dataset", tiny_shapes_coco["config"]])  # fmt: skip
    (by_onnx,) = (tmp_path / "onnx" / "vis_res").glob("*/detections.json")
    (by_torch,) = (tmp_path / "torch" / "vis_res").glob("*/detections.json")
    drawn, expected = json.loads(by_onnx.read_text()), json.loads(by_torch.read_text())
    assert {k: len(v) for k, v in drawn.items()} == {k: len(v) for k, v in expected.items()}
    assert sum(map(len, drawn.values())) > 0

    def rows(by_image: dict) -> list[dict]:
        return [
            {**d, "image_id": name, "category_id": d["class_id"]} for name, ds in by_image.items() for d in ds
        ]

    # the JSON rounds to 0.01 px: two rounding steps apart at most (+1e-6: 143.96 - 143.94 is above 0.02 in
    # binary floating point)
    assert not _unmatched(rows(drawn), rows(expected), 1e-4, 0.02 + 1e-6)
