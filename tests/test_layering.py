"""The layering rule of the README's "Layout": a folder of yolox_fast/ imports only from the layers below it,
`api/` -> `tools/` -> `core/` -> `exp/` -> `evaluators/` -> `inference/` -> `export/` -> `data/`, `models/`,
`tracking/` -> `utils/` (the three side by side: none imports another), and nothing in yolox_fast/ imports
from the repository's tools/, benchmarks/ or exps/. Read from the source with `ast`, so imports inside
functions count as well."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "yolox_fast"
LAYERS = {
    "utils": 0, "data": 1, "models": 1, "tracking": 1,
    "export": 2,  # exported files: each format's writer and runner; the Predictor runs what they load
    "inference": 3, "evaluators": 4, "exp": 5, "core": 6,
    "tools": 7,  # the command-line tools (tools/*.py at the top of the repository are shims over them)
    "api": 8,  # the Python API, over the tools' own code
}  # fmt: skip
OUTSIDE = ("tools", "benchmarks", "exps")  # the scripts and exp files around the package


def imported_modules(path: Path, package: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file at `path` of `package`, relative ones made
    absolute; for `from package import name` both the package and package.name (a name may be a
    submodule)."""
    parts = path.relative_to(package.parent).with_suffix("").parts  # ("yolox_fast", "data", "build")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = parts[: len(parts) - node.level]
                base = ".".join([*package, *([node.module] if node.module else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def layering_violations(package: Path = PACKAGE) -> list[str]:
    """'file:line folder -> module' for each import of a layer at or above the importing folder's own (other
    than the folder itself), or of the scripts outside the package."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if len(relative.parts) == 1:  # yolox_fast/__init__.py: the package's front door, above every layer
            continue
        layer = relative.parts[0]
        for line, module in imported_modules(path, package):
            names = module.split(".")
            if names[0] in OUTSIDE:
                problems.append(f"{relative}:{line} {layer} -> {module}")
            elif names[0] == "yolox_fast" and len(names) > 1 and names[1] in LAYERS and names[1] != layer:
                if LAYERS[names[1]] >= LAYERS[layer]:
                    problems.append(f"{relative}:{line} {layer} -> {module}")
    return sorted(set(problems))


def test_every_folder_is_a_layer_of_the_package():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS), "a new folder needs its place in the README's Layout and in LAYERS here"


def test_no_folder_imports_a_layer_above_its_own():
    assert layering_violations() == []


def test_an_upward_import_is_found_also_inside_a_function_and_relative(tmp_path):
    package = tmp_path / "yolox_fast"
    for folder in LAYERS:
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "utils" / "boxes.py").write_text(
        "from yolox_fast.utils import dist\n\ndef f():\n    from yolox_fast.models import simota\n"
    )
    (package / "data" / "build.py").write_text("from ..models import head\nfrom ..utils.boxes import f\n")
    (package / "models" / "head.py").write_text("import yolox_fast.data.augment\nimport benchmarks.inputs\n")
    (package / "core" / "trainer.py").write_text("from yolox_fast import exp, evaluators\n")
    assert layering_violations(package) == [
        "data/build.py:1 data -> yolox_fast.models",
        "data/build.py:1 data -> yolox_fast.models.head",
        "models/head.py:1 models -> yolox_fast.data.augment",
        "models/head.py:2 models -> benchmarks.inputs",
        "utils/boxes.py:4 utils -> yolox_fast.models",
        "utils/boxes.py:4 utils -> yolox_fast.models.simota",
    ]
