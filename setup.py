"""Packaging for yolox_fast. `pip install -e .[test]` installs the package and its test tools.

The dataset descriptions live in the top-level `configs/` and the example exps in `exps/example/` (beside
`exps/` and `tools/`, where a user looks for them). A build copies them into the package as
`yolox_fast/configs/` and `yolox_fast/exp/example/`, so a wheel or a plain `pip install .` carries them (the
quick start runs as `yolox_fast train -n shapes-nano`); an editable install and a checkout read the top-level
folders themselves (`yolox_fast.data.paths.CONFIG_DIR`, `yolox_fast.exp.build.EXAMPLE_DIR`). A copy at
build time rather than a symlink: checkouts without symlink support (Windows) build the same package.
The tools are the package's `yolox_fast.tools`, run as the `yolox_fast` command (`yolox_fast/__main__.py`).
"""

import re
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent


# top-level folder, files copied, their folder in the built package
SHIPPED = (("configs", "*.json", "configs"), ("exps/example", "*.py", "exp/example"))


class BuildPyWithConfigs(build_py):
    """build_py, then configs/*.json and exps/example/*.py into the built package (SHIPPED)."""

    def run(self):
        super().run()
        for source, pattern, folder in SHIPPED:
            target = Path(self.build_lib) / "yolox_fast" / folder
            target.mkdir(parents=True, exist_ok=True)
            for path in sorted((HERE / source).glob(pattern)):
                shutil.copyfile(path, target / path.name)


VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "yolox_fast" / "__init__.py").read_text()).group(1)

setup(
    name="yolox_fast",
    version=VERSION,
    description="YOLOX object detection training: batched SimOTA, shared image cache, native AMP, DDP",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["yolox_fast", "yolox_fast.*"]),
    cmdclass={"build_py": BuildPyWithConfigs},
    entry_points={"console_scripts": ["yolox_fast = yolox_fast.__main__:main"]},
    install_requires=[
        # no upper bound: CI pins the tested pair (torch 2.14.1, torchvision 0.29.1, .ci/run); a newer torch
        # is the user's to choose
        "torch>=2.5",
        "torchvision>=0.20",
        "numpy",
        # the build with a GUI, for `tools/demo.py webcam`'s window (where none can open, the demo says so and
        # writes the video); a headless build installed instead works for everything else
        "opencv-python",
        "pycocotools",
        # COCOeval in C++: equal to pycocotools on our tests, 9x faster on a COCO-sized case
        # (python tools/benchmark.py eval);
        # pycocotools stays the fallback when it is missing
        "faster-coco-eval",
        "matplotlib",  # eval pictures and tools/check_dataset.py plots (Agg canvas, no display)
        "loguru",
        "tabulate",
        "tensorboard",
        "psutil",
        # parses a COCO annotation file's box fields and skips its masks unbuilt (data/datasets/coco_json.py)
        "msgspec",
        "pyyaml",  # Ultralytics data.yaml dataset descriptions
        "pillow",  # image sizes from file headers (YOLO sets carry no sizes)
        "imagesize",  # the size of an image too large for Pillow to open (a decompression bomb), to refuse it
        "scipy",  # the trackers' linear assignment (tools/demo.py --track)
    ],
    extras_require={
        # the trackers' tests run W&B (offline) and MLflow (SQLite, a local server) for real
        # and every export runtime (ONNX, OpenVINO with NNCF for INT8) exports, evaluates and demos for real
        "test": [
            "pytest",
            "pytest-timeout",
            "pytest-xdist",  # the suite runs on two workers (pyproject addopts)
            "onnx",
            "onnxruntime",
            "openvino",
            "nncf",
            "ruff",
            "wandb",
            "mlflow",
            "supervision",
            "motmetrics",  # MOTA / IDF1 of tools/benchmark.py track
        ],
        "onnx": ["onnx", "onnxruntime"],  # tools/export.py --format onnx (and its INT8), eval/demo on .onnx
        # --format openvino; NNCF quantizes it to INT8 (--int8); onnx: OpenVINO converts from an ONNX export
        "openvino": ["openvino", "nncf", "onnx"],
        # --format tensorrt, on an NVIDIA GPU (untested on the CPU machine this is developed on)
        "tensorrt": ["tensorrt", "onnx"],
        "wandb": ["wandb"],  # -l wandb
        "mlflow": ["mlflow"],  # -l mlflow
        "supervision": ["supervision"],  # Results.to_supervision (the Python API)
    },
)
