"""The layering rule of the README's "Layout": a folder of yolox_fast/ imports only from the layers below it,
`api/` -> `tools/` -> `core/` -> `exp/` -> `evaluators/` -> `inference/` -> `export/` -> `data/`, `models/`,
`tracking/` -> `utils/` (the three side by side: none imports another), and nothing in yolox_fast/ imports
from the repository's tools/, benchmarks/ or exps/. Read from the source with `ast`, so imports inside
functions count as well. And no import circle: no module's module-level imports lead back to it, and data/
imports only at module top (a function-level import there is how its circle was once dodged)."""

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
    found = []
    for node, base, _ in _imports(path, package):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        else:
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _imports(path: Path, package: Path) -> list[tuple[ast.Import | ast.ImportFrom, str, bool]]:
    """(node, the module a `from` import names, made absolute, whether it is at module top) of every import
    in the file at `path` of `package`. At module top: run when the module is imported, so not inside a
    function (one inside a class or an `if`/`try` at top level is)."""
    parts = path.relative_to(package.parent).with_suffix("").parts  # ("yolox_fast", "data", "build")
    found = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    folder = parts[: len(parts) - child.level]
                    base = ".".join([*folder, *([child.module] if child.module else [])])
                found.append((child, base, top))
            elif isinstance(child, ast.Import):
                found.append((child, "", top))
            is_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, top and not is_function)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file of every module of `package` (a package's `__init__.py` under its own name)."""
    files = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of `package` its imports at module top load when it is imported (those inside
    functions run later): `import a.b` loads a.b, `from a import b` loads a.b where that is a module, else
    a."""
    files = module_files(package)
    graph = {}
    for name, path in files.items():
        loaded = set()
        for node, base, top in _imports(path, package):
            if not top:
                continue
            if isinstance(node, ast.Import):
                loaded |= {alias.name for alias in node.names}
            else:
                loaded |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[name] = loaded & files.keys()
    return graph


def import_circles(package: Path = PACKAGE) -> list[list[str]]:
    """The import circles of `package`: each group of modules whose module-level imports lead from any of
    them to every other and back (a module that imports itself is one too), sorted."""
    graph = import_graph(package)

    def reachable(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += graph[name]
        return seen

    reach = {name: reachable(name) for name in graph}
    circles = {frozenset(n for n in reach[m] if m in reach[n]) for m in graph if m in reach[m]}
    return sorted(sorted(circle) for circle in circles)


def imports_below_module_top(folder: str, package: Path = PACKAGE) -> list[str]:
    """'file:line' of each import of `package`/`folder` that is not at module top (inside a function)."""
    return [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted((package / folder).rglob("*.py"))
        for node, _, top in _imports(path, package)
        if not top
    ]


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


def test_no_import_circle():
    assert import_circles() == []


def test_every_import_in_data_is_at_module_top():
    assert imports_below_module_top("data") == []


def test_an_import_circle_is_found_through_module_top_imports_only(tmp_path):
    package = tmp_path / "yolox_fast"
    (package / "data" / "datasets").mkdir(parents=True)
    for folder in (package, package / "data", package / "data" / "datasets"):
        (folder / "__init__.py").write_text("")
    # the circle data/ once had: the description loader -> the YOLO reader -> the loader's path helpers
    (package / "data" / "config.py").write_text("from yolox_fast.data.datasets import yolo\n")
    (package / "data" / "datasets" / "yolo.py").write_text(
        "try:\n    from ..config import datasets_root\nexcept ImportError:\n    pass\n"
    )
    # a package's __init__ and its submodules, and an import inside a function: no circle
    (package / "data" / "__init__.py").write_text("from yolox_fast.data import layouts\n")
    (package / "data" / "layouts.py").write_text(
        "import yolox_fast.data.datasets.base\n\ndef describe():\n    from yolox_fast.data import layouts\n"
    )
    (package / "data" / "datasets" / "base.py").write_text("class Base:\n    import yolox_fast.data.cache\n")
    (package / "data" / "cache.py").write_text("from yolox_fast.data.datasets.base import Base\n")
    assert import_circles(package) == [
        ["yolox_fast.data.cache", "yolox_fast.data.datasets.base"],
        ["yolox_fast.data.config", "yolox_fast.data.datasets.yolo"],
    ]
    assert imports_below_module_top("data", package) == ["data/layouts.py:4"]
