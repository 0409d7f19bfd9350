"""A checkpoint of ours describes itself: `-c best_ckpt.pth` alone is enough for eval, demo and export (the
exp is rebuilt from the fields the trainer stores in it), and -f/-n/overrides still win."""

import json
from pathlib import Path

import pytest
import torch
from helpers import run_tool_in_process

from yolox_fast.exp import Exp, get_exp, get_exp_by_checkpoint
from yolox_fast.utils.checkpoint import save_checkpoint


def trained_like_checkpoint(path: Path, dataset: str, output_dir: Path) -> Exp:
    """A checkpoint laid out as the trainer writes it (weights, class names, exp fields) for a 64 px nano with
    6 classes on `dataset`; returns the exp it stores."""
    exp = Exp()
    exp.depth, exp.width, exp.depthwise = 0.33, 0.25, True
    exp.num_classes, exp.dataset, exp.exp_name = 6, dataset, "tiny_nano"
    exp.input_size = exp.test_size = (64, 64)
    exp.output_dir, exp.data_num_workers, exp.test_conf = str(output_dir), 0, 0.001
    torch.manual_seed(0)
    state = {
        "model": exp.get_model().state_dict(),
        "class_names": ["circle", "square", "triangle", "star", "cross", "ring"],
        "exp": exp.fields(),
    }
    save_checkpoint(state, path)
    return exp


def test_the_exp_is_rebuilt_from_the_stored_fields(tmp_path):
    written = trained_like_checkpoint(tmp_path / "best_ckpt.pth", "shapes", tmp_path)
    rebuilt = get_exp_by_checkpoint(str(tmp_path / "best_ckpt.pth"))
    assert rebuilt.fields() == written.fields()
    assert isinstance(rebuilt.test_size, tuple) and rebuilt.exp_name == "tiny_nano"
    assert get_exp(None, "yolox-s", str(tmp_path / "best_ckpt.pth")).width == 0.5  # -n wins over -c


def test_stored_fields_this_version_does_not_know_are_listed_not_applied(tmp_path, log_lines):
    exp = Exp()
    save_checkpoint({"model": {}, "exp": {**exp.fields(), "gone_field": 3}}, tmp_path / "old.pth")
    assert not hasattr(get_exp_by_checkpoint(str(tmp_path / "old.pth")), "gone_field")
    assert any("gone_field" in line and "not applied" in line for line in log_lines)


def test_a_checkpoint_without_exp_fields_asks_for_f_or_n(tmp_path):
    save_checkpoint({"model": {"w": torch.zeros(1)}}, tmp_path / "official.pth")
    with pytest.raises(ValueError, match=r"stores no exp fields.*-f FILE or -n NAME"):
        get_exp_by_checkpoint(str(tmp_path / "official.pth"))
    with pytest.raises(ValueError, match=r"-c best_ckpt.pth"):
        get_exp(None, None, None)


def test_eval_demo_and_export_take_the_checkpoint_alone(tiny_shapes_coco, tmp_path):
    ckpt = tmp_path / "run" / "best_ckpt.pth"
    trained_like_checkpoint(ckpt, tiny_shapes_coco["config"], tmp_path)
    out = run_tool_in_process("eval", "-c", ckpt, "-b", "4", cwd=tmp_path)
    assert "AP50:95" in out and "| circle " in out
    assert (tmp_path / "tiny_nano" / "eval").is_dir()  # the stored exp_name and output_dir

    images = Path(tiny_shapes_coco["root"]) / "val2017"
    run_tool_in_process("demo", "image", "-c", ckpt, "--path", images, "--save-json", cwd=tmp_path)
    (saved,) = (tmp_path / "tiny_nano" / "vis_res").glob("*/detections.json")
    assert len(json.loads(saved.read_text())) == tiny_shapes_coco["num_val"]

    pytest.importorskip("onnxruntime")
    onnx = tmp_path / "m.onnx"
    # an override still applies on top of the stored fields: the file's input size is the override's
    run_tool_in_process("export", "-c", ckpt, "--output-name", onnx, "test_size", "(96,96)", cwd=tmp_path)
    from yolox_fast.export import load_exported_model

    meta = load_exported_model(str(onnx)).metadata
    assert (meta.test_size, meta.exp_name, meta.class_names[0]) == ((96, 96), "tiny_nano", "circle")
