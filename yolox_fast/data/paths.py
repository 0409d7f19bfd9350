"""Where datasets and their descriptions live: the built-in descriptions' folder and the datasets folder.

The datasets folder is `$YOLOX_DATADIR`, else `./datasets`; a description's root may start with
`$YOLOX_DATADIR`. The bottom of `data/`: it imports nothing from the package.
"""

from __future__ import annotations

import os
import string
from pathlib import Path


def _config_dir() -> Path:
    """The built-in descriptions: the package's copy (a wheel or `pip install .`), else the checkout's
    top-level configs/ (an editable install, a source tree)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


CONFIG_DIR = _config_dir()


def datasets_root() -> Path:
    """The folder that holds the datasets: $YOLOX_DATADIR, else `datasets` in the working directory."""
    return Path(os.environ.get("YOLOX_DATADIR") or "datasets").expanduser().absolute()


def resolve_root(root: str) -> str:
    """A description's root as an absolute path: `$YOLOX_DATADIR` expanded, relative to the working dir."""
    expanded = string.Template(str(root)).safe_substitute(YOLOX_DATADIR=str(datasets_root()))
    return str(Path(expanded).expanduser().absolute())


def builtin_names() -> list[str]:
    """The names of the built-in descriptions (`coco`, `voc`, `shapes`): the .json files of CONFIG_DIR."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
