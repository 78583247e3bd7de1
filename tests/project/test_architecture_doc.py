"""docs/architecture.md names every module of the request path (``pipeline/``, ``store/``), so
a newcomer finds any change's place from it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "kb_rerank"


def test_every_pipeline_and_store_module_is_in_the_architecture_page():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [f"{pkg}/{f.name}" for pkg in ("pipeline", "store") for f in sorted((PACKAGE / pkg).glob("*.py"))
               if f.name != "__init__.py" and f"`{f.name}`" not in page and f"{pkg}/{f.name}" not in page]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"


def test_the_page_names_no_module_that_does_not_exist():
    import re

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\b((?:pipeline|store|http|models|ingest|eval|admin)/[a-z_]+\.py)", page))
    gone = sorted(n for n in named if not (PACKAGE / n).exists())
    assert not gone, f"docs/architecture.md names modules that are gone: {', '.join(gone)}"
