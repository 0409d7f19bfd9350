"""Running a trained detector: the Predictor and the batch forward + NMS every caller shares."""

from yolox_fast.inference.predictor import (
    Detections,
    Predictor,
    detect_batch,
    load_inference_model,
    model_device,
    model_memory_format,
    to_original_coords,
)

__all__ = [
    "Detections",
    "Predictor",
    "detect_batch",
    "load_inference_model",
    "model_device",
    "model_memory_format",
    "to_original_coords",
]
