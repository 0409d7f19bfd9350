"""Exported model files: one module per format (its writer and its runner together), the table of formats
(`formats.FORMATS`), what the formats share (`common`: the input/output contract, the metadata, the runner
wrapper, the checks) and the decode + NMS a graph can end in (`graph_nms`)."""

from yolox_fast.export.common import CalibrationImages, ExportedModel, ExportMetadata, output_diff
from yolox_fast.export.formats import (
    FORMATS,
    ExportFormat,
    export_file,
    export_metadata,
    exported_format,
    exported_size,
    load_exported_model,
)
from yolox_fast.export.graph_nms import GraphNMS
from yolox_fast.utils.extras import MissingExtraError, require

__all__ = [
    "FORMATS",
    "CalibrationImages",
    "ExportFormat",
    "ExportMetadata",
    "ExportedModel",
    "GraphNMS",
    "MissingExtraError",
    "export_file",
    "export_metadata",
    "exported_format",
    "exported_size",
    "load_exported_model",
    "output_diff",
    "require",
]
