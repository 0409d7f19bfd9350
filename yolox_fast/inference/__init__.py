"""Running a trained detector: the Predictor and the batch forward + NMS every caller shares."""

from yolox_fast.inference.predictor import (
    Detections,
    Predictor,
    detect_batch,
    load_inference_model,
    to_original_coords,
)

__all__ = ["Detections", "Predictor", "detect_batch", "load_inference_model", "to_original_coords"]
