"""docs/architecture.md names every module of the package, each in its folder's row, so a
newcomer finds any change's place from it; and it names no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "kb_rerank"
PAGE = ROOT / "docs" / "architecture.md"


def _rows() -> dict[str, str]:
    """The module table's rows: folder (as written, e.g. ``core/``) -> the row's text."""
    table = PAGE.read_text(encoding="utf-8").split("## Modules by capability", 1)[1]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+/)` \| (.*) \|$", table, re.M)}


def test_every_module_is_named_in_its_folders_row():
    rows = _rows()
    missing = []
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        if folder.name == "testing":  # named in the top-level row
            continue
        row = rows.get(folder.name + "/", "")
        for f in sorted(folder.rglob("*.py")):
            if f.name == "__init__.py" or not (f.parent / "__init__.py").exists():
                continue  # not a module: scripts loaded by path (the Alembic revisions of db/migrations/)
            rel = f.relative_to(folder).as_posix()
            if f"`{f.name}`" not in row and rel not in row:
                missing.append(f"{folder.name}/{rel}")
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_the_page_names_no_module_that_does_not_exist():
    page = PAGE.read_text(encoding="utf-8")
    folders = "|".join(p.name for p in PACKAGE.iterdir() if p.is_dir())
    named = set(re.findall(rf"\b((?:{folders}|pipeline|store|admin)/[a-z_/]+\.py)", page))
    gone = sorted(n for n in named if not (PACKAGE / n).exists())
    assert not gone, f"docs/architecture.md names modules that are gone: {', '.join(gone)}"
