"""yolox_fast: YOLOX object detection with a batched, memory-bounded SimOTA assigner."""

__version__ = "0.1.0"
