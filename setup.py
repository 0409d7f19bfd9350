"""Packaging for yolox_fast. `pip install -e .[test]` installs the package and its test tools."""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "yolox_fast" / "__init__.py").read_text()).group(1)

setup(
    name="yolox_fast",
    version=VERSION,
    description="YOLOX object detection training: batched SimOTA, shared image cache, native AMP, DDP",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["yolox_fast", "yolox_fast.*"]),
    # the built-in dataset descriptions (the model zoo's exps are modules, found as packages)
    package_data={"yolox_fast.data": ["configs/*.json"]},
    install_requires=[
        "torch>=2.5,<=2.14.1",
        "torchvision>=0.20,<=0.29.1",
        "numpy",
        "opencv-python-headless",
        "pycocotools",
        # COCOeval in C++: equal to pycocotools on our tests, 9x faster on a COCO-sized case
        # (python tools/benchmark.py eval);
        # pycocotools stays the fallback when it is missing
        "faster-coco-eval",
        "matplotlib",  # eval pictures: confusion matrix, PR and F1 curves (Agg canvas, no display)
        "loguru",
        "tabulate",
        "tensorboard",
        "psutil",
        "pyyaml",  # Ultralytics data.yaml dataset descriptions
        "pillow",  # image sizes from file headers (YOLO sets carry no sizes)
        "matplotlib",  # tools/check_dataset.py plots (Agg)
    ],
    extras_require={
        "test": ["pytest", "pytest-timeout", "onnx", "onnxruntime", "ruff"],
        "onnx": ["onnx", "onnxruntime"],
    },
)
