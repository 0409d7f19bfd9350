"""Decoding, score filter and NMS as part of the model, so that an exported graph ends in detections.

`DetectWithNMS` wraps a YOLOX model (boxes decoded in the head) and returns a fixed-size, padded result that
any runtime can read without our Python:

    detections      (B, D, 6) float32  [x1, y1, x2, y2, score, class] in input pixels (the letterboxed
                                       image), sorted by score, rows past the count all zero
    num_detections  (B,)      int64    how many rows of each image are detections

score = objectness * best class probability, kept when score > conf; NMS at IoU `iou` within each class
(or across classes when `class_agnostic`); at most D = min(max_det, anchors) per image. Exported to ONNX
the suppression is the standard `NonMaxSuppression` op (opset >= 10), which onnxruntime, OpenVINO and
TensorRT all run; in torch the same module computes it with torchvision, so the two can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

OUTPUT_NAMES = ("detections", "num_detections")


@dataclass(frozen=True)
class GraphNMS:
    """The suppression an exported graph ends in: keep score > `conf`, NMS at IoU `iou` (within each class
    unless `class_agnostic`), at most `max_det` detections per image (fewer when the graph has fewer
    anchors)."""

    conf: float
    iou: float
    class_agnostic: bool = False
    max_det: int = 100


class NonMaxSuppression(torch.autograd.Function):
    """ONNX NonMaxSuppression: boxes (B, A, 4), scores (B, C, A) -> selected (K, 3) int64 rows
    [image, class, anchor], at most `max_per_class` per image and class, scores > `score_threshold`.

    In torch it runs torchvision's NMS; exported, it is the single ONNX op (the symbolic below).
    """

    @staticmethod
    def forward(ctx, boxes, scores, max_per_class: int, iou_threshold: float, score_threshold: float):
        import torchvision  # loaded already by DetectWithNMS.__init__

        rows = []
        for b in range(scores.shape[0]):
            for c in range(scores.shape[1]):
                candidates = torch.nonzero(scores[b, c] > score_threshold)[:, 0]  # (n,) anchor ids
                kept = torchvision.ops.nms(boxes[b, candidates], scores[b, c, candidates], iou_threshold)
                anchors = candidates[kept[:max_per_class]]
                image_class = torch.tensor([b, c], dtype=torch.int64).expand(len(anchors), 2)
                rows.append(torch.cat([image_class, anchors[:, None]], dim=1))
        return torch.cat(rows) if rows else torch.zeros(0, 3, dtype=torch.int64)

    @staticmethod
    def symbolic(g, boxes, scores, max_per_class: int, iou_threshold: float, score_threshold: float):
        def constant(value, dtype):
            return g.op("Constant", value_t=torch.tensor([value], dtype=dtype))

        return g.op(
            "NonMaxSuppression",
            boxes,
            scores,
            constant(max_per_class, torch.int64),
            constant(iou_threshold, torch.float32),
            constant(score_threshold, torch.float32),
        )


class DetectWithNMS(nn.Module):
    """`model` (its head decoding boxes to pixels) followed by the score filter and NMS `nms`; see the module
    docstring for the outputs. `num_anchors` fixes D = min(nms.max_det, num_anchors) (TopK needs D <= A)."""

    def __init__(self, model: nn.Module, num_anchors: int, nms: GraphNMS) -> None:
        super().__init__()
        # torchvision (seconds to import, so not at the top of the module) is loaded here rather than at
        # its first use in the NMS forward: under the ONNX tracer its import runs an op the tracer rejects
        import torchvision  # noqa: F401

        if nms.max_det < 1:
            raise ValueError(f"max_det must be >= 1, got {nms.max_det}")
        self.model = model
        self.conf = float(nms.conf)
        self.iou = float(nms.iou)
        self.class_agnostic = nms.class_agnostic
        self.max_det = min(nms.max_det, num_anchors)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(images)  # (B, A, 5 + C): cx, cy, w, h (px), obj, class probabilities
        batch, anchors = out.shape[:2]
        centre, size = out[..., :2], out[..., 2:4]
        boxes = torch.cat([centre - size / 2, centre + size / 2], dim=-1)  # (B, A, 4) x1y1x2y2
        class_prob, class_id = out[..., 5:].max(dim=-1)  # (B, A) each
        scores = out[..., 4] * class_prob  # (B, A)
        if self.class_agnostic:
            nms_scores = scores[:, None, :]  # (B, 1, A): one class, suppression across all
        else:
            # (B, C, A): each anchor scores only in its best class, so NMS within a class sees each box once
            classes = torch.arange(out.shape[-1] - 5, device=out.device)
            own = classes[None, :, None] == class_id[:, None, :]
            nms_scores = torch.where(own, scores[:, None, :], torch.zeros_like(scores[:, None, :]))
        selected = NonMaxSuppression.apply(boxes, nms_scores, self.max_det, self.iou, self.conf)  # (K, 3)
        kept = torch.zeros(batch, anchors, dtype=scores.dtype, device=scores.device)
        kept[selected[:, 0], selected[:, 2]] = 1.0
        # the kept boxes first, best score first, whatever order the runtime's NMS listed them in
        ranked = torch.where(kept > 0, scores, torch.full_like(scores, -1.0))  # (B, A)
        top, index = ranked.topk(self.max_det, dim=1)  # (B, D) each
        valid = top >= 0  # (B, D)
        picked_boxes = torch.gather(boxes, 1, index[..., None].expand(-1, -1, 4))  # (B, D, 4)
        picked_class = torch.gather(class_id, 1, index).to(scores.dtype)  # (B, D)
        detections = torch.cat([picked_boxes, top[..., None], picked_class[..., None]], dim=-1)
        # (B, D, 6), the padding zeroed by a where: an untrained model's inf boxes times 0 would be NaN
        detections = torch.where(valid[..., None], detections, torch.zeros_like(detections))
        return detections, valid.sum(dim=1)
