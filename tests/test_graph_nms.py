"""NMS in the exported graph: the torch module equals postprocess; the ONNX and OpenVINO files equal the torch
module at any batch; eval and the demo take such a file as -c and give the raw file's AP and boxes; flags that
do not fit are one error line."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import load_tool, run_tool_here
from test_export import _error_line, _lively_nano, _printed_ap

from yolox_fast.export import ExportMetadata, export_metadata, load_exported_model, output_diff
from yolox_fast.export.graph_nms import DetectWithNMS, GraphNMS
from yolox_fast.export.onnx import export_onnx
from yolox_fast.export.openvino import export_openvino
from yolox_fast.inference import Predictor
from yolox_fast.utils.boxes import postprocess

pytest.importorskip("onnxruntime")
NAMES = ["circle", "square", "triangle", "star", "cross", "ring"]


@pytest.fixture(scope="module")
def lively(tiny_shapes_coco):
    """(exp, model, images (4, 3, 64, 64)) of a random nano whose scores and boxes vary with the image."""
    exp, model = _lively_nano(tiny_shapes_coco["config"], 64)
    images = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(3)) * 255
    return exp, model, images


def _anchors(model, images) -> int:
    with torch.no_grad():
        return model(images[:1]).shape[1]


@pytest.mark.parametrize("agnostic", [False, True])
def test_torch_module_keeps_what_postprocess_keeps_best_first_and_pads_with_zeros(lively, agnostic):
    _, model, images = lively
    nms = GraphNMS(conf=0.2, iou=0.45, class_agnostic=agnostic, max_det=30)
    with torch.no_grad():
        detections, counts = DetectWithNMS(model, _anchors(model, images), nms)(images)
        expected = postprocess(model(images), 6, 0.2, 0.45, class_agnostic=agnostic)
    assert detections.shape == (4, 30, 6) and counts.dtype == torch.int64
    for dets, n, ref in zip(detections, counts, expected):
        ref = ref[:30]  # postprocess sorts by score: the best 30 are what the graph keeps
        assert int(n) == len(ref) > 0
        torch.testing.assert_close(dets[:n, :4], ref[:, :4])
        torch.testing.assert_close(dets[:n, 4], ref[:, 4] * ref[:, 5])
        assert torch.equal(dets[:n, 5], ref[:, 6])
        assert not dets[n:].any()


def test_max_det_is_capped_by_the_anchors(lively):
    _, model, images = lively
    anchors = _anchors(model, images)
    graph = DetectWithNMS(model, anchors, GraphNMS(0.0, 1.0, max_det=10_000))
    with torch.no_grad():
        detections, _ = graph(images)
    assert detections.shape[1] == anchors


def test_metadata_round_trips_and_files_without_nms_stay_readable_by_older_versions(lively):
    exp, model, _ = lively
    raw = export_metadata(exp, model, NAMES, "onnx", False, None)
    assert "nms" not in json.loads(raw.to_json())  # the field older readers do not know is left out
    assert ExportMetadata.from_json(raw.to_json(), "raw.onnx") == raw
    ends_in_nms = export_metadata(exp, model, NAMES, "openvino", False, None, nms=GraphNMS(0.1, 0.5, True, 7))
    assert ExportMetadata.from_json(ends_in_nms.to_json(), "nms.xml") == ends_in_nms


@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
@pytest.mark.parametrize("static_batch", [None, 3])
def test_exported_graph_ends_in_the_torch_modules_detections(lively, fmt, static_batch, tmp_path):
    exp, model, images = lively
    nms = GraphNMS(conf=0.1, iou=0.5, max_det=20)
    meta = export_metadata(exp, model, NAMES, fmt, False, static_batch, nms=nms)
    path = str(tmp_path / ("model.onnx" if fmt == "onnx" else "model.xml"))
    (export_onnx if fmt == "onnx" else export_openvino)(model, path, meta, static_batch or 2)
    exported = load_exported_model(path)
    assert exported.metadata.nms == nms and exported.metadata.decode_in_graph
    # 4 images: a dynamic graph at another batch than traced, a static batch-3 one fed 3 + 1 padded
    # px, boxes up to ~200 px: the runtimes' fp32 kernels differ with the CPU (OpenVINO on an AVX-512 EPYC:
    # 0.011 px, ONNX Runtime 0.002); another box kept or another order would be off by pixels
    diff, _ = output_diff(model, exported, images)
    assert diff < 0.05, diff
    with pytest.raises(ValueError, match="ends in NMS"):
        exported(images)


def test_a_higher_threshold_applies_after_the_graph_and_what_cannot_apply_is_said_once(
    lively, tmp_path, log_lines
):
    exp, model, images = lively
    frames = [np.ascontiguousarray(img.permute(1, 2, 0).numpy().astype(np.uint8)) for img in images]
    detections = {}
    for conf in (0.1, 0.3):
        path = str(tmp_path / f"conf{conf}.onnx")
        meta = export_metadata(exp, model, NAMES, "onnx", False, None, nms=GraphNMS(conf, 0.5, max_det=84))
        export_onnx(model, path, meta)
        predictor = Predictor(load_exported_model(path), 6, (64, 64), 0.3, 0.5)
        detections[conf] = predictor.predict(frames)
    assert sum(map(len, detections[0.3])) > 0
    for low, high in zip(detections[0.1], detections[0.3]):
        np.testing.assert_allclose(low, high, atol=1e-4)
    assert not [line for line in log_lines if "cannot apply" in line]
    lenient = Predictor(load_exported_model(str(tmp_path / "conf0.3.onnx")), 6, (64, 64), 0.01, 0.45, "cpu")
    lenient.predict(frames[:1])
    lenient.predict(frames[1:2])
    said = [line for line in log_lines if "cannot apply" in line]
    assert len(said) == 1 and "score threshold 0.01" in said[0] and "NMS IoU 0.45" in said[0]


def test_export_flags_that_do_not_fit_nms_are_one_error_line(capsys):
    base = ["-n", "yolox-nano", "--tsize", "64", "--nms"]
    for flags in (["--format", "torchscript"], ["--format", "onnx", "--int8"]):
        line = _error_line("export", [*flags, *base], capsys)
        assert "for ONNX and OpenVINO, and not built for INT8" in line


@pytest.mark.slow
def test_eval_and_demo_take_the_nms_file_with_the_raw_files_ap_and_boxes(lively, tiny_shapes_coco, tmp_path):
    exp, model, _ = lively
    ckpt = tmp_path / "lively.pth"
    torch.save({"model": model.state_dict(), "class_names": NAMES}, ckpt)
    data = ["num_classes", "6", "dataset", tiny_shapes_coco["config"], "output_dir", str(tmp_path)]
    export = load_tool("export")
    common = ["-n", "yolox-nano", "-c", str(ckpt), "--tsize", "64", "--dynamic", *data]
    export.main(["--output-name", str(tmp_path / "raw.onnx"), *common])
    # the exp's eval thresholds (test_conf, nmsthre, within each class) and every anchor: eval's own NMS
    export.main(["--output-name", str(tmp_path / "nms.onnx"), "--nms", "--max-det", "1000", *common])
    export.main(["--format", "openvino", "--output-name", str(tmp_path / "nms.xml"), "--nms", *common])
    # the demo's thresholds (0.3, IoU 0.3 across classes) in the graph
    demo_nms = ["--nms", "--nms-conf", "0.3", "--nms-iou", "0.3", "--nms-agnostic"]
    export.main(["--output-name", str(tmp_path / "demo.onnx"), *demo_nms, *common])

    scored = {}
    for name in ("raw.onnx", "nms.onnx", "nms.xml"):
        done = run_tool_here("eval", "-c", tmp_path / name, "data_num_workers", 0, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        scored[name] = _printed_ap(done.stderr)
    assert scored["nms.onnx"] == scored["raw.onnx"], scored
    # at most 100 detections an image (the default --max-det): COCO's AP counts the best 100 as well
    assert scored["nms.xml"] == scored["raw.onnx"], scored

    images = Path(tiny_shapes_coco["root"]) / "val2017"
    shown = ["--path", str(images), "-b", "3", "--save-json", "output_dir", str(tmp_path)]
    demo = load_tool("demo")
    drawn = {}
    for name in ("raw.onnx", "demo.onnx"):
        run = name.replace(".", "_")
        demo.main(["image", "-c", str(tmp_path / name), "-expn", run, *shown])
        (saved,) = (tmp_path / run / "vis_res").glob("*/detections.json")
        drawn[name] = json.loads(saved.read_text())
    assert sum(map(len, drawn["raw.onnx"].values())) > 0
    for image, expected in drawn["raw.onnx"].items():
        got = drawn["demo.onnx"][image]
        assert [d["class_id"] for d in got] == [d["class_id"] for d in expected], image
        np.testing.assert_allclose([d["bbox"] for d in got], [d["bbox"] for d in expected], atol=0.02 + 1e-6)
        np.testing.assert_allclose([d["score"] for d in got], [d["score"] for d in expected], atol=2e-5)
