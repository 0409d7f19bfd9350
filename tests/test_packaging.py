"""A plain (non-editable) install works from any working directory: the model zoo, the built-in dataset
descriptions and the synthetic set's generation need nothing from the checkout."""

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
    from yolox_fast.data.config import CONFIG_DIR, load_dataset_config
    from yolox_fast.exp import Exp, get_exp

    site = Path(sys.argv[1]).resolve()
    assert Path(yolox_fast.__file__).resolve().is_relative_to(site), yolox_fast.__file__
    # the top-level configs/ of the checkout, copied into the package by the build
    assert CONFIG_DIR == site / "yolox_fast" / "configs", CONFIG_DIR
    zoo = {name: get_exp(None, name).depth for name in ("yolox-nano", "yolox-s", "yolox-x", "yolox-voc-s")}
    roots = {name: load_dataset_config(name)["root"] for name in ("coco", "voc", "shapes")}
    exp = Exp()
    exp.dataset = "shapes"
    names = exp.get_class_names()
    cfg = load_dataset_config("shapes")
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
