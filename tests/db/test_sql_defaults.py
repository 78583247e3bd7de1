"""The SQL functions' parameter defaults are the settings' declared defaults: the idempotent
layer renders each ``{{default:NAME}}`` from setting NAME's declaration, and this test reads
the defaults back from the catalog of a migrated database (pg_get_function_arguments), so a
psql caller omitting an argument gets what the service passes with default settings."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from kb_rerank.core.settings import RULES, Settings, default
from kb_rerank.db import layer

# (function, parameter) -> the setting whose default it is
SETTING_OF = {
    ("search_lexical", "k"): "candidates",
    ("search_lexical", "k1"): "bm25_k1",
    ("search_lexical", "b"): "bm25_b",
    ("search_lexical_ids", "k"): "candidates",
    ("search_lexical_ids", "k1"): "bm25_k1",
    ("search_lexical_ids", "b"): "bm25_b",
    ("search_lexical_ids_bm25", "k"): "candidates",
    ("search_lexical_ids_bm25", "k1"): "bm25_k1",
    ("search_lexical_ids_bm25", "b"): "bm25_b",
    ("search_semantic", "k"): "candidates",
    ("search_semantic_ids", "k"): "candidates",
    ("search_hybrid", "k"): "fusion_depth",
    ("search_hybrid", "rrf_k"): "rrf_k",
    ("search_hybrid", "fusion"): "fusion_method",
    ("search_hybrid", "lexical_weight"): "lexical_weight",
    ("search_hybrid", "semantic_weight"): "semantic_weight",
    ("search_hybrid", "k1"): "bm25_k1",
    ("search_hybrid", "b"): "bm25_b",
    ("refresh_term_blocks", "list_length"): "term_list_length",
    ("refresh_term_blocks", "min_df"): "term_list_min_df",
    ("refresh_term_blocks", "k1"): "bm25_k1",
    ("refresh_term_blocks", "b"): "bm25_b",
    ("rerank_search", "top_n"): "rerank_top_n",
}
# defaults that no setting has: a batch size of the owner's eviction call, and the SQL rerank's source
NO_SETTING = {("evict_expired_cache", "batch"),
              ("rerank_search", "source"),  # the API request's default source, SOURCES[0] (endpoints/requests.py)
              # the tenant-table rule's options (db/sql/tenant_policies.sql), run by the layer only
              ("apply_tenant_policies", "names")}

_ARG = re.compile(r"^(?:(?:IN|OUT|INOUT|VARIADIC) )?(\w+) (.+?) DEFAULT (.+)$")


def _catalog_defaults(conn) -> dict[tuple[str, str], str]:
    """(function, parameter) -> its default expression, for every kb function with one (NULL
    defaults left out: an optional filter, not a value)."""
    out: dict[tuple[str, str], str] = {}
    rows = conn.execute("select p.proname, pg_get_function_arguments(p.oid) from pg_proc p"
                        " join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'kb'").fetchall()
    for name, args in rows:
        for arg in args.split(", ") if args else []:
            m = _ARG.match(arg)
            if m and m.group(3) != "NULL::jsonb" and not m.group(3).startswith("NULL"):
                assert (name, m.group(1)) not in out or out[(name, m.group(1))] == m.group(3), (name, arg)
                out[(name, m.group(1))] = m.group(3)
    return out


def _value(expr: str):
    """A catalog default expression as a Python value: ``'convex'::text``, ``0.7``, ``60``."""
    literal = re.sub(r"::[a-z ]+$", "", expr).strip("()")
    if literal.startswith("'"):
        return literal[1:-1].replace("''", "'")
    return float(literal)


def test_every_sql_default_with_a_setting_is_that_settings_default(owner_conn):
    found = _catalog_defaults(owner_conn)
    assert set(found) - set(SETTING_OF) - NO_SETTING == set(), \
        "a SQL default that is neither a setting's ({{default:NAME}}) nor listed in NO_SETTING"
    assert set(SETTING_OF) - set(found) == set(), "a parameter listed here has no default in the catalog"
    for (fn, param), name in SETTING_OF.items():
        want = default(name)
        got = _value(found[(fn, param)])
        assert got == (want if isinstance(want, str) else float(want)), f"kb.{fn}({param}) = {got}, {name} = {want}"


def test_the_defaults_that_disagreed_are_the_running_ones(owner_conn):
    """kb.search_hybrid's RRF constant is 10 and its fusion convex, as the service passes."""
    found = _catalog_defaults(owner_conn)
    assert _value(found[("search_hybrid", "rrf_k")]) == 10 == Settings().rrf_k
    assert _value(found[("search_hybrid", "fusion")]) == "convex" == Settings().fusion_method


def test_render_fills_each_default_from_the_declaration(monkeypatch):
    path = layer.package_dir() / "retrieval" / "sql" / "search_hybrid.sql"
    text = layer.render(path, embedding_dim=384)
    assert "{{" not in text and "rrf_k integer default 10," in text and "fusion text default 'convex'," in text
    monkeypatch.setattr(Settings.__dataclass_fields__["rrf_k"], "default", 42)
    assert "rrf_k integer default 42," in layer.render(path, embedding_dim=384)


@pytest.mark.parametrize("value,literal", [(60, "60"), (0.7, "0.7"), (0.75, "0.75"), ("convex", "'convex'"),
                                           ("it's", "'it''s'"), (True, "true")])
def test_sql_literal(value, literal):
    assert layer.sql_literal(value) == literal


def test_an_unknown_setting_in_a_placeholder_is_an_error(tmp_path):
    f = tmp_path / "x.sql"
    f.write_text("select {{default:no_such_setting}};", encoding="utf-8")
    with pytest.raises(KeyError, match="no_such_setting"):
        layer.render(f, embedding_dim=384)
    assert {f.name for f in fields(Settings)} >= set(SETTING_OF.values()) and set(SETTING_OF.values()) <= set(RULES)
