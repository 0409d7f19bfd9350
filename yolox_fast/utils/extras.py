"""Optional packages behind pip extras (`yolox_fast[onnx]`, `[openvino]`, `[supervision]`, ...): imported when
a feature needs them, with an error that says which extra installs them."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """A runtime package is not installed; the message names the extra that installs it."""


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, or raise MissingExtraError naming `pip install "yolox_fast[extra]"`."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtraError(
            f'{module} is not installed: pip install "yolox_fast[{extra}]" ({err})'
        ) from None
