"""Every ``kb_rerank.…`` name the package's code and docstrings mention exists: a module, or an
attribute of one (a moved or renamed module leaves no reference that leads nowhere)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "kb_rerank"
NOT_MODULES = {"kb_rerank.access"}  # a logger's name (the access log), not a module
REF = re.compile(r"\bkb_rerank(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(ref: str) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def unresolved(root: Path) -> list[str]:
    out = []
    for f in sorted(root.rglob("*.py")):
        text = f.read_text(encoding="utf-8")
        for m in REF.finditer(text):
            if m.group(0) not in NOT_MODULES and not resolves(m.group(0)):
                out.append(f"{f.relative_to(root.parent)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    return out


def test_every_dotted_reference_in_the_package_resolves():
    assert unresolved(PACKAGE) == []


def test_a_reference_to_a_module_that_is_gone_is_found(tmp_path):
    pkg = tmp_path / "kb_rerank"
    pkg.mkdir()
    (pkg / "m.py").write_text('"""See :mod:`kb_rerank.gone` and :func:`kb_rerank.endpoints.runner.Pipeline.run`."""\n')
    assert [r.split(": ")[-1] for r in unresolved(pkg)] == ["kb_rerank.gone"]
