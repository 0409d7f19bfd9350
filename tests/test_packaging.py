"""A plain (non-editable) install works from any working directory: the model zoo, the built-in dataset
descriptions and the synthetic set's generation need nothing from the checkout; a wheel installed in a fresh
virtual environment runs the quick start by name, the `yolox_fast` command and the Python API."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHECK = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import yolox_fast
    from yolox_fast.data.description import read_description
    from yolox_fast.data.paths import CONFIG_DIR
    from yolox_fast.exp import Exp, get_exp

    site = Path(sys.argv[1]).resolve()
    assert Path(yolox_fast.__file__).resolve().is_relative_to(site), yolox_fast.__file__
    # the top-level configs/ of the checkout, copied into the package by the build
    assert CONFIG_DIR == site / "yolox_fast" / "configs", CONFIG_DIR
    zoo = {name: get_exp(None, name).depth for name in ("yolox-nano", "yolox-s", "yolox-x", "yolox-voc-s")}
    roots = {name: read_description(name)["root"] for name in ("coco", "voc", "shapes")}
    exp = Exp()
    exp.dataset = "shapes"
    names = exp.get_class_names()
    cfg = read_description("shapes")
    cfg["synthetic"] = {"num_train": 3, "num_val": 2, "size": 64}
    from yolox_fast.data.datasets.synthetic import ensure_generated
    ensure_generated(cfg)
    print(json.dumps({"zoo": zoo, "roots": roots, "names": list(names),
                      "generated": sorted(p.name for p in Path(cfg["root"]).iterdir())}))
    """
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package as `pip install .` puts it (a wheel built from this checkout), in its own folder."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return site


def installed_env(site: Path, **env: str) -> dict:
    """This environment with only the installed copy on the path (and no YOLOX_DATADIR unless given)."""
    base = {k: v for k, v in os.environ.items() if k != "YOLOX_DATADIR"}
    return {**base, "PYTHONPATH": str(site), **env}


def run_installed(site: Path, cwd: Path, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(site)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=installed_env(site, **env),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_zoo_and_dataset_names_resolve_from_another_directory(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run_installed(installed, elsewhere)
    assert out["zoo"] == {"yolox-nano": 0.33, "yolox-s": 0.33, "yolox-x": 1.33, "yolox-voc-s": 0.33}
    # relative roots land in the working directory's datasets/, never in site-packages
    assert out["roots"] == {
        "coco": str(elsewhere / "datasets" / "COCO"),
        "voc": str(elsewhere / "datasets" / "VOCdevkit"),
        "shapes": str(elsewhere / "datasets" / "shapes"),
    }
    assert out["names"][:2] == ["circle", "square"]
    assert {"annotations", "train2017", "val2017"} <= set(out["generated"])
    assert (elsewhere / "datasets" / "shapes" / "val2017" / "000002.jpg").is_file()
    # the repository's benchmarks/ (like its tests/) are not part of the install
    assert not (installed / "benchmarks").exists() and not (installed / "tests").exists()


@pytest.mark.slow
def test_yolox_datadir_moves_the_datasets(installed, tmp_path):
    data = tmp_path / "data"
    out = run_installed(installed, tmp_path, YOLOX_DATADIR=str(data))
    assert out["roots"]["coco"] == str(data / "COCO")
    assert (data / "shapes" / "train2017" / "000003.jpg").is_file()


@pytest.mark.slow
def test_the_checkout_tools_run_on_the_installed_package(installed, tmp_path):
    # a description of a (tiny) synthetic set under $YOLOX_DATADIR: the tool generates it, then evaluates
    desc = tmp_path / "tiny.json"
    desc.write_text(
        json.dumps(
            {
                "name": "tiny",
                "format": "coco",
                "root": "$YOLOX_DATADIR/tiny",
                "train": {"images": "train2017", "ann": "instances_train2017.json"},
                "val": {"images": "val2017", "ann": "instances_val2017.json"},
                "class_names": ["circle", "square", "triangle", "star", "cross", "ring"],
                "synthetic": {"num_train": 2, "num_val": 3, "size": 64},
            }
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "eval.py"),
            "-n",
            "yolox-nano",
            "--speed",
            "-b",
            "2",
            "dataset",
            str(desc),
            "num_classes",
            "6",
            "test_size",
            "(64,64)",
            "output_dir",
            str(tmp_path / "out"),
            "data_num_workers",
            "0",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=installed_env(installed, YOLOX_DATADIR=str(tmp_path / "data")),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Average forward time" in done.stderr and "3 images" in done.stderr
    assert (tmp_path / "data" / "tiny" / "val2017" / "000003.jpg").is_file()


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment outside the checkout with the wheel of this checkout installed (`pip wheel
    --no-deps .`, then `pip install` of that file); torch and the other dependencies come from this
    interpreter's site-packages (--system-site-packages), the package itself only from the wheel."""
    root = tmp_path_factory.mktemp("wheel")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip_wheel, "-w", str(root), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = root.glob("yolox_fast-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True, timeout=300)
    # without PYTHONPATH: a checkout on it (its build's egg-info) would pass for an installed yolox_fast
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return venv


def in_venv(venv: Path, cwd: Path, *command: str, timeout: int = 600) -> str:
    """`command` as typed in a shell with the venv activated, from `cwd`; asserts exit 0, returns stdout +
    stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "YOLOX_DATADIR")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), YOLOX_FAST_HOME=str(cwd))
    done = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout + done.stderr


API_SNIPPET = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import yolox_fast
    from yolox_fast import YOLOX

    assert Path(yolox_fast.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), yolox_fast.__file__
    model = YOLOX("YOLOX_outputs/shapes_nano/best_ckpt.pth")
    results = model.predict("datasets/tiny/val2017", conf=0.01, batch=4)
    metrics = model.val(batch=4)
    path = model.export(format="onnx", output_name="api.onnx")
    print(json.dumps({"images": len(results), "names": list(results[0].names), "ap50": metrics.ap50,
                      "classes": sorted(metrics.per_class), "export": path}))
    """
)


@pytest.mark.slow
def test_the_wheel_runs_the_quick_start_by_name_and_the_api_outside_the_checkout(wheel_venv, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    in_venv(wheel_venv, work, "yolox_fast", "make-dataset", "--out", "datasets/tiny", "--num-train", "16",
            "--num-val", "4", "--size", "64")  # fmt: skip
    tiny = ["dataset", "datasets/tiny/dataset.json", "input_size", "(64,64)", "random_size", "(2,2)"]
    tiny += ["test_size", "(64,64)", "data_num_workers", "0", "max_epoch", "2", "no_aug_epochs", "1"]
    tiny += ["eval_interval", "1", "basic_lr_per_img", "0.0005"]
    in_venv(wheel_venv, work, "yolox_fast", "train", "-n", "shapes-nano", "-b", "4", "-l", "none", *tiny)
    ckpt = "YOLOX_outputs/shapes_nano/best_ckpt.pth"
    assert (work / ckpt).is_file()
    # the checkpoint alone: eval, demo and export rebuild the exp from it
    assert "AP50:95" in in_venv(wheel_venv, work, "yolox_fast", "eval", "-c", ckpt, "-b", "4")
    in_venv(wheel_venv, work, "yolox_fast", "demo", "image", "-c", ckpt, "--path", "datasets/tiny/val2017",
            "--save-json", "--conf", "0.01")  # fmt: skip
    (saved,) = (work / "YOLOX_outputs" / "shapes_nano" / "vis_res").glob("*/detections.json")
    assert len(json.loads(saved.read_text())) == 4
    exported = in_venv(wheel_venv, work, "yolox_fast", "export", "-c", ckpt, "--output-name", "m.onnx")
    assert "max abs diff" in exported
    assert (work / "m.onnx").is_file()

    printed = in_venv(wheel_venv, work, "python", "-c", API_SNIPPET).splitlines()
    out = json.loads([line for line in printed if line.startswith("{")][-1])
    assert out["images"] == 4 and out["names"][:2] == ["circle", "square"]
    assert out["classes"] == sorted(out["names"]) and 0 <= out["ap50"] <= 1
    assert out["export"] == "api.onnx" and (work / "api.onnx").is_file()

    # YOLOX's module form, and the benchmarks, which live in the repository only
    assert "usage" in in_venv(wheel_venv, work, "python", "-m", "yolox_fast.tools.train", "-h")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(wheel_venv / "bin" / "yolox_fast"), "benchmark", "demo"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "benchmarks live in the yolox_fast repository" in done.stderr
