"""The `yolox_fast` command (yolox_fast/__main__.py): one entry point for every tool, the same flags as
`python tools/TOOL.py`, and the example exps by name."""

import json
import subprocess
import sys

import pytest
from helpers import REPO

from yolox_fast.__main__ import COMMANDS, main
from yolox_fast.exp import get_exp
from yolox_fast.exp.build import EXAMPLES, exp_names


def test_every_command_is_a_tool_module_with_a_main_and_a_checkout_shim():
    import importlib

    for command, (module, _) in COMMANDS.items():
        assert callable(importlib.import_module(f"yolox_fast.tools.{module}").main), command
        assert (REPO / "tools" / f"{module}.py").is_file(), command


def test_the_example_exps_resolve_by_name():
    assert {"shapes-nano", "finetune-nano", "custom-coco", "custom-yolo"} <= set(exp_names())
    shapes = get_exp(None, "shapes-nano")
    assert (shapes.exp_name, shapes.num_classes, shapes.dataset) == ("shapes_nano", 6, "shapes")
    assert get_exp(None, "Finetune_Nano").num_classes is None  # as many as the dataset has
    assert len(EXAMPLES) == len(list((REPO / "exps" / "example").glob("*.py")))


def test_a_command_runs_its_tool_with_the_same_flags(tmp_path, capsys):
    out = tmp_path / "set"
    main(["make-dataset", "--out", str(out), "--num-train", "2", "--num-val", "1", "--size", "64"])
    assert "dataset description" in capsys.readouterr().out
    assert len(json.loads((out / "dataset.json").read_text())["class_names"]) == 6


def test_usage_and_an_unknown_command(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["trian"])
    assert stop.value.code == 2 and "unknown command 'trian'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    printed = capsys.readouterr().out
    assert stop.value.code == 0 and all(command in printed for command in (*COMMANDS, "benchmark"))


@pytest.mark.slow
def test_python_m_forms_run_from_a_fresh_process(tmp_path):
    """`python -m yolox_fast COMMAND` and YOLOX's `python -m yolox_fast.tools.TOOL`, as typed."""
    for argv in (["-m", "yolox_fast", "check"], ["-m", "yolox_fast.tools.check_dataset"]):
        done = subprocess.run(
            [sys.executable, *argv, "-n", "shapes-nano", "--headers-only", "--output", str(tmp_path / "c")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={"PYTHONPATH": str(REPO), "YOLOX_DATADIR": str(tmp_path / "data"), "PATH": ""},
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "0 errors" in done.stdout and (tmp_path / "c" / "labels.png").is_file()


def test_benchmark_runs_the_checkouts_suites(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as stop:
        main(["benchmark"])  # no suite: tools/benchmark.py's own usage line
    assert stop.value.code == 2 and "python tools/benchmark.py {simota," in capsys.readouterr().out
