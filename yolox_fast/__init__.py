"""yolox_fast: YOLOX object detection with a batched, memory-bounded SimOTA assigner.

`from yolox_fast import YOLOX` is the Python API (docs/python.md); the command line is `yolox_fast COMMAND`.
"""

__version__ = "0.1.0"
__all__ = ["YOLOX", "Results", "__version__"]


def __getattr__(name: str):
    # imported on first use: `import yolox_fast` (the command line's start, `__version__`) stays free of torch
    if name in ("YOLOX", "Results"):
        from yolox_fast import api

        return getattr(api, name)
    raise AttributeError(f"module 'yolox_fast' has no attribute {name!r}")
