"""The Python API: `YOLOX(model).predict / val / train / export`, and the `Results` predict returns
(docs/python.md)."""

from yolox_fast.api.model import YOLOX
from yolox_fast.api.results import Results

__all__ = ["YOLOX", "Results"]
