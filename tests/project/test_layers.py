"""The package's import graph runs one way: entry points -> endpoints -> the HTTP plumbing ->
capabilities (the database folder among them: it applies every capability's SQL) -> models ->
the core. The layers are declared once here; the
test reads every module's imports (function-level ones included) and fails on an import that
runs back up a layer or on a circle between two folders of one layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "kb_rerank"

# Top to bottom. A folder (or a top-level module) may import its own layer and the ones below.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("entry points", frozenset({"__main__", "app", "cli", "integrations", "eval", "testing", "plpython"})),
    ("endpoints", frozenset({"endpoints"})),
    ("HTTP plumbing", frozenset({"http"})),
    ("capabilities", frozenset({"retrieval", "filters", "guard", "rerank", "cache", "audit", "ingest",
                                "db", "sqlfiles", "migrations"})),
    ("models", frozenset({"models"})),
    ("core", frozenset({"core", "__init__"})),
)


def _unit(module: str) -> str:
    """The folder (or top-level module) a dotted module name below kb_rerank belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(unit: str) -> int:
    for i, (_, units) in enumerate(LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"kb_rerank.{unit} is in no layer: add it to LAYERS in {Path(__file__).name}")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every kb_rerank module a file imports (absolute and relative imports, any depth)."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "kb_rerank")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "kb_rerank":
                continue
            found.add(mod)
            if mod == "kb_rerank":  # `from kb_rerank import cli`: the names are modules or attributes
                found.update(f"kb_rerank.{a.name}" for a in node.names if (PACKAGE / a.name).exists()
                             or (PACKAGE / f"{a.name}.py").exists())
    return found


def _graph() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the files where that import is written."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "versions" in path.parts:  # frozen migration revisions import only kb_rerank.sqlfiles
            continue
        src = _unit(_module_name(path)) if path != PACKAGE / "__init__.py" else "__init__"
        for mod in _imports(path):
            dst = _unit(mod)
            if dst != src:
                edges.setdefault((src, dst), []).append(str(path.relative_to(PACKAGE)))
    return edges


def test_every_folder_is_in_a_layer():
    units = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.stem for p in PACKAGE.glob("*.py")}
    for unit in sorted(units):
        _layer(unit)


def test_no_import_runs_back_up_a_layer():
    upward = [f"kb_rerank.{a} ({LAYERS[_layer(a)][0]}) imports kb_rerank.{b} ({LAYERS[_layer(b)][0]}) in {files}"
              for (a, b), files in sorted(_graph().items()) if _layer(b) < _layer(a)]
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


def test_no_circle_between_folders():
    edges = _graph()
    succ: dict[str, set[str]] = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            u = todo.pop()
            if u == goal:
                return True
            if u not in seen:
                seen.add(u)
                todo.extend(succ.get(u, ()))
        return False

    circles = sorted({tuple(sorted((a, b))) for (a, b) in edges if reaches(b, a)})
    assert not circles, "folders that import each other (directly or through others): " + "; ".join(
        f"{a} <-> {b} ({edges.get((a, b)) or edges.get((b, a))})" for a, b in circles)


@pytest.mark.parametrize("code, expected", [
    ("from kb_rerank.core.settings import Settings", {"kb_rerank.core.settings"}),
    ("from kb_rerank import cli", {"kb_rerank", "kb_rerank.cli"}),
    ("import kb_rerank.guard.verdict as v", {"kb_rerank.guard.verdict"}),
    ("from ..core import session", {"kb_rerank.core"}),
])
def test_the_reader_of_imports(tmp_path, code, expected, monkeypatch):
    f = PACKAGE / "guard" / "verdict.py"
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: code)
    assert _imports(f) == expected
