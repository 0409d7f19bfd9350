"""Checkpoint I/O: weights_only loading, fine-tune and strict loads, damaged files, atomic saves."""

import argparse
import os
import shutil

import numpy as np
import pytest
import torch
from loguru import logger
from torch import nn

from yolox_fast.exp import get_exp
from yolox_fast.utils.checkpoint import load_checkpoint, load_model_weights, save_checkpoint

CLS_PRED_KEYS = [f"head.cls_preds.{i}.{p}" for i in range(3) for p in ("weight", "bias")]


def nano(num_classes=80):
    exp = get_exp(exp_name="yolox-nano")
    exp.num_classes = num_classes
    return exp.get_model()


@pytest.fixture
def warnings_log():
    messages = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    yield messages
    logger.remove(sink)


def test_round_trip_strict_gives_identical_model(tmp_path):
    torch.manual_seed(0)
    src, dst = nano(), nano()
    path = tmp_path / "ckpt.pth"
    save_checkpoint({"model": src.state_dict(), "start_epoch": 3, "best_ap": 0.25, "name": "nano"}, path)
    ckpt = load_checkpoint(path)
    assert (ckpt["start_epoch"], ckpt["best_ap"], ckpt["name"]) == (3, 0.25, "nano")
    assert load_model_weights(dst, ckpt, strict=True) == []
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), k
    x = torch.rand(1, 3, 64, 64) * 255
    with torch.no_grad():
        torch.testing.assert_close(src.eval()(x), dst.eval()(x))


def test_raw_state_dict_and_ddp_prefix_are_accepted():
    src = nano()
    dst = nano()
    assert load_model_weights(dst, src.state_dict(), strict=True) == []
    prefixed = {f"module.{k}": v for k, v in src.state_dict().items()}
    assert load_model_weights(dst, {"model": prefixed}, strict=True) == []


def test_optimizer_state_survives_weights_only_round_trip(tmp_path):
    model = nano()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    model.head.obj_preds[0].bias.grad = torch.ones(1)
    opt.step()
    save_checkpoint({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "c.pth")
    state = load_checkpoint(tmp_path / "c.pth")["optimizer"]
    opt.load_state_dict(state)
    assert state["param_groups"][0]["nesterov"] is True


def test_fine_tune_with_other_num_classes_skips_exactly_cls_preds(warnings_log):
    src, dst = nano(80), nano(3)
    skipped = load_model_weights(dst, {"model": src.state_dict()})
    assert sorted(skipped) == sorted(CLS_PRED_KEYS)
    log = "".join(warnings_log)
    assert all(k in log for k in CLS_PRED_KEYS)
    assert "(80, 64, 1, 1)" in log and "(3, 64, 1, 1)" in log
    assert "trained for 80 classes, exp has 3" in log
    assert torch.equal(dst.head.reg_preds[1].weight, src.head.reg_preds[1].weight)
    assert torch.equal(
        dst.backbone.backbone.stem.conv.bn.running_var, src.backbone.backbone.stem.conv.bn.running_var
    )


def test_missing_and_unexpected_keys_are_skipped_and_listed(warnings_log):
    state = nano().state_dict()
    del state["head.obj_preds.2.bias"]
    state["head.extra.weight"] = torch.zeros(2)
    skipped = load_model_weights(nano(), state)
    assert skipped == ["head.obj_preds.2.bias"]
    log = "".join(warnings_log)
    assert "missing in checkpoint" in log and "head.extra.weight" in log


def test_strict_load_names_the_class_count_mismatch():
    with pytest.raises(RuntimeError, match="trained for 80 classes, exp has 3") as info:
        load_model_weights(nano(3), nano(80).state_dict(), strict=True)
    assert "head.cls_preds.0.weight" in str(info.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        load_checkpoint(tmp_path / "nope.pth")


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_damaged_file_gives_clear_error_naming_it(tmp_path, damage):
    path = tmp_path / "best_ckpt.pth"
    save_checkpoint({"model": nano().state_dict()}, path)
    data = path.read_bytes()
    path.write_bytes(
        {"truncated": data[: len(data) // 2], "empty": b"", "garbage": b"not a checkpoint" * 8}[damage]
    )
    with pytest.raises(RuntimeError, match="truncated or corrupt") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_pickled_objects_are_refused_by_weights_only_loading(tmp_path):
    path = tmp_path / "unsafe.pth"
    torch.save(
        {"model": {}, "args": argparse.Namespace(lr=0.1)}, path
    )  # a class instance: arbitrary unpickling
    with pytest.raises(RuntimeError, match="weights_only") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("value", [np.float32(0.1), np.float64(0.1), np.arange(3), {1.5: 1}])
def test_save_refuses_entries_weights_only_cannot_read(tmp_path, value):
    with pytest.raises(TypeError, match=r"state\['meta'\]\['lr'\]"):
        save_checkpoint({"meta": {"lr": value}}, tmp_path / "c.pth")
    assert not any(tmp_path.iterdir())


def test_save_accepts_every_type_weights_only_reads(tmp_path):
    state = {
        "model": {"w": torch.ones(2), "p": nn.Parameter(torch.zeros(1))},
        "meta": {"epoch": 3, "lr": 0.1, "amp": True, "name": "s", "raw": b"x", "none": None},
        "shape": torch.Size([2, 3]),
        "sizes": [(640, 640), [416, 416]],
        "dtype": torch.float16,
        "device": torch.device("cpu"),
        7: "int key",
    }
    save_checkpoint(state, tmp_path / "c.pth")
    loaded = load_checkpoint(tmp_path / "c.pth")
    assert loaded["meta"] == state["meta"] and loaded["sizes"] == state["sizes"] and loaded[7] == "int key"
    assert loaded["shape"] == torch.Size([2, 3]) and loaded["dtype"] is torch.float16


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "last_epoch_ckpt.pth"
    save_checkpoint({"epoch": 1, "w": torch.arange(4)}, path)
    before = path.read_bytes()

    def crash_mid_write(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", crash_mid_write)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint({"epoch": 2, "w": torch.arange(8)}, path)
    assert path.read_bytes() == before
    assert load_checkpoint(path)["epoch"] == 1
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left behind


def test_save_creates_parent_directories_and_replaces(tmp_path):
    path = tmp_path / "run" / "sub" / "c.pth"
    save_checkpoint({"epoch": 1}, path)
    save_checkpoint({"epoch": 2}, path)
    assert load_checkpoint(path)["epoch"] == 2
    assert os.listdir(path.parent) == ["c.pth"]


def test_official_style_checkpoint_with_numpy_scalars_loads(tmp_path):
    """Official YOLOX training stores best_ap/curr_ap as numpy.float64; weights_only loading takes them."""
    import numpy as np

    path = tmp_path / "official.pth"
    torch.save(
        {
            "model": {"w": torch.ones(2)},
            "best_ap": np.float64(0.4),
            "curr_ap": np.float32(0.3),
            "start_epoch": 5,
        },
        path,
    )
    ckpt = load_checkpoint(path)
    assert float(ckpt["best_ap"]) == 0.4 and torch.equal(ckpt["model"]["w"], torch.ones(2))


def test_saved_checkpoint_is_readable_as_the_umask_allows(tmp_path):
    import os
    import stat

    path = tmp_path / "ckpt.pth"
    umask = os.umask(0o022)
    try:
        save_checkpoint({"model": {"w": torch.ones(1)}}, path)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_full_disk_says_so_with_the_numbers_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "latest_ckpt.pth"
    save_checkpoint({"epoch": 1, "w": torch.zeros(4)}, path)
    before = path.read_bytes()
    big = {"epoch": 2, "w": torch.zeros(1 << 20)}  # 4 MiB of tensors
    real_usage = shutil.disk_usage

    def little_room(folder):
        return real_usage(folder)._replace(free=1 << 20)

    monkeypatch.setattr(shutil, "disk_usage", little_room)
    with pytest.raises(
        OSError,
        match=r"no space left on .* while writing latest_ckpt.pth \(needs about 4.0 MiB, 1.0 MiB free\)",
    ):
        save_checkpoint(big, path)
    assert path.read_bytes() == before

    # the shortage shows only while writing: torch's own error is translated, nothing half-written stays
    monkeypatch.setattr(shutil, "disk_usage", real_usage)

    def fills_the_disk(obj, f, *args, **kwargs):
        f.write(b"x" * 1000)
        monkeypatch.setattr(shutil, "disk_usage", little_room)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", fills_the_disk)
    with pytest.raises(OSError, match="no space left on .* while writing latest_ckpt.pth"):
        save_checkpoint(big, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name]
