"""The search filter's grammar in Python (kb_rerank.filters.grammar, the REST 422) and its
SQL twin (kb.search_filter, SQLSTATE 22023) accept and refuse the same filters, name the same
field and write the same canonical form: one table of cases through both. The SQL twin's
limits are the Python constants, rendered into the idempotent layer."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from kb_rerank.db import layer as sqlfiles
from kb_rerank.filters import grammar as filters
from kb_rerank.core.session import tenant_transaction

F, N, S = filters.MAX_FIELDS, filters.MAX_IN, filters.MAX_STRING

# (filter as JSON text, None when accepted, else the field the error names). The JSON text
# is given as such so that numbers reach both sides written as a caller writes them.
CASES: list[tuple[str, str | None]] = [
    ("null", None),
    ("{}", None),
    ('{"product": "billing"}', None),
    ('{"product": {"$eq": "billing"}}', None),
    ('{"tags": {"$in": ["a", "b", "c"]}}', None),
    (json.dumps({f"k{i}": i for i in range(F)}), None),
    (json.dumps({f"k{i}": i for i in range(F + 1)}), "filter"),
    (json.dumps({"p": {"$in": list(range(N))}}), None),
    (json.dumps({"p": {"$in": list(range(N + 1))}}), "filter.p.$in"),
    (json.dumps({"p": "x" * S}), None),
    (json.dumps({"p": "x" * (S + 1)}), "filter.p"),
    (json.dumps({"p": {"$gte": "x" * (S + 1)}}), "filter.p.$gte"),
    (json.dumps({"a" * 64: 1}), None),
    (json.dumps({"a" * 65: 1}), "filter"),
    ('{"a b": 1}', "filter"),
    ("[]", "filter"),
    ('"billing"', "filter"),
    ('{"product": null}', "filter.product"),
    ('{"product": ["a", "b"]}', "filter.product"),
    ('{"product": {}}', "filter.product"),
    ('{"product": {"$in": []}}', "filter.product.$in"),
    ('{"product": {"$in": "billing"}}', "filter.product.$in"),
    ('{"product": {"$eq": "a", "$gte": 1}}', "filter.product"),
    # operators, $or and nesting: plain words naming the field
    ('{"product": {"$ne": "a"}}', "filter.product.$ne"),
    ('{"product": {"$regex": "a.*"}}', "filter.product.$regex"),
    ('{"product": {"nested": {"x": 1}}}', "filter.product.nested"),
    ('{"$or": [{"a": 1}, {"b": 2}]}', "filter.$or"),
    ('{"$and": [{"a": 1}]}', "filter.$and"),
    # numbers: finite doubles, |x| <= 1e308, integers of at most 40 significant digits
    ('{"v": 2}', None),
    ('{"v": 2.0}', None),
    ('{"v": -2.5}', None),
    ('{"v": 1e308}', None),
    ('{"v": -1e308}', None),
    ('{"v": 1e309}', "filter.v"),
    ('{"v": {"$in": [1, 1e400]}}', "filter.v.$in"),
    ('{"v": {"$gte": 1e309}}', "filter.v.$gte"),
    ('{"v": 1e-400}', None),
    ('{"v": 0.1}', None),
    ('{"v": 123456789012345678901234567890}', None),
    ('{"v": 9007199254740993}', None),
    ('{"v": %s}' % ("1" * 40), None),
    ('{"v": %s}' % ("1" * 41), "filter.v"),
    ('{"v": %s}' % ("9" * 401), "filter.v"),
    ('{"v": {"$gt": 2, "$lte": 3.5}}', None),
    ('{"v": {"$gte": 1, "$gt": 2}}', "filter.v"),
    ('{"v": {"$gte": 1, "$lt": "2024-01-01"}}', "filter.v"),
    ('{"v": {"$gte": true}}', "filter.v.$gte"),
    # dates: ISO 8601, years 1 to 9999 in UTC
    ('{"updated_at": {"$gte": "2024-01-01"}}', None),
    ('{"updated_at": "2024-05-01T10:00:00+02:00"}', None),
    ('{"updated_at": {"$lt": "2024-05-01 10:00Z"}}', None),
    ('{"ingested_at": {"$gte": "2024-01-01T00:00:00.5-0130"}}', None),
    ('{"released": {"$gte": "2024-01-01", "$lt": "2025-01-01"}}', None),
    ('{"updated_at": {"$gte": "9999-12-31T23:59:59.999999+00:00"}}', None),
    ('{"updated_at": {"$gte": "9999-12-31T23:59:59.999999-23:59"}}', "filter.updated_at.$gte"),
    ('{"updated_at": {"$gte": "0001-01-01T00:00+23:59"}}', "filter.updated_at.$gte"),
    ('{"updated_at": "0001-01-01T00:00-01:00"}', None),
    ('{"updated_at": {"$gte": "yesterday"}}', "filter.updated_at.$gte"),
    ('{"updated_at": {"$gte": "2024-13-01"}}', "filter.updated_at.$gte"),
    ('{"updated_at": {"$gte": "2024-02-30"}}', "filter.updated_at.$gte"),
    ('{"updated_at": {"$lt": 5}}', "filter.updated_at.$lt"),
    ('{"updated_at": "now"}', "filter.updated_at"),
    ('{"ingested_at": 5}', "filter.ingested_at"),
    # reserved string fields
    ('{"title": {"$gte": "a"}}', "filter.title"),
    ('{"source_path": 3}', "filter.source_path"),
    ('{"source_path": {"$in": ["a.md", "b.md"]}}', None),
    # language: normalised as ingestion normalises it
    ('{"language": "JA"}', None),
    ('{"language": {"$in": ["ja-JP", "jpn", "Japanese", "en_US", "iw", " de "]}}', None),
    ('{"language": "ceb"}', None),
    ('{"language": "not a language"}', "filter.language"),
    ('{"language": ""}', "filter.language"),
    ('{"language": 1}', "filter.language"),
]


def _num(x: Any) -> Any:
    """Numbers as decimals of their shortest text (a double's repr, PostgreSQL's numeric)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return {k: _num(v) for k, v in x.items()} if isinstance(x, dict) else \
            [_num(v) for v in x] if isinstance(x, list) else x
    return Decimal(repr(x)) if isinstance(x, float) else Decimal(x)


def _sql(conn, text: str):
    """kb.search_filter on the JSON text: ("ok", canonical) or ("error", field, message)."""
    try:
        with conn.transaction():
            got = conn.execute("select kb.search_filter(%s::jsonb)::text", [text]).fetchone()[0]
    except psycopg.errors.InvalidParameterValue as exc:
        return "error", exc.diag.column_name, exc.diag.message_primary
    return "ok", (None if got is None else json.loads(got, parse_float=Decimal, parse_int=Decimal))


def _python(text: str):
    try:
        got = filters.canonical(json.loads(text))
    except filters.FilterError as exc:
        return "error", exc.field, str(exc)
    return "ok", _num(got)


@pytest.mark.parametrize("text, field", CASES, ids=[f"{i}-{f or 'ok'}" for i, (_, f) in enumerate(CASES)])
def test_python_and_sql_agree(app_conn, text, field):
    py, sql = _python(text), _sql(app_conn, text)
    if field is None:
        assert py[0] == "ok", py
        assert sql == py
    else:
        assert py[:2] == ("error", field), py
        assert sql[:2] == ("error", field), sql
        # the same words, field first
        assert sql[2] == py[2], (sql[2], py[2])
        assert sql[2].startswith(field + ":")


def test_errors_speak_plain_words():
    """An unknown operator lists the allowed ones; $or and nesting say what to do; no regular
    expression or decoder text."""
    for text in ('{"p": {"$ne": 1}}', '{"$or": [{"a": 1}]}', '{"p": {"x": {"y": 1}}}', '{"a b": 1}'):
        with pytest.raises(filters.FilterError) as exc:
            filters.canonical(json.loads(text))
        assert "^" not in exc.value.detail and "[A-Z" not in exc.value.detail and "Expected" not in exc.value.detail
    with pytest.raises(filters.FilterError, match=r"allowed: \$eq, \$in, \$gte, \$gt, \$lte, \$lt"):
        filters.canonical({"p": {"$ne": 1}})
    with pytest.raises(filters.FilterError, match=r"\$in"):
        filters.canonical({"$or": [{"a": 1}]})


def test_language_is_normalised_never_silently_empty():
    assert filters.canonical({"language": "JA"}) == {"language": {"$in": ["ja"]}}
    assert filters.canonical({"language": {"$in": ["pt_BR", "English", "eng"]}}) == \
        {"language": {"$in": ["pt", "en", "en"]}}


def test_the_sql_layer_holds_the_python_constants():
    """The rendered layer carries the Python limits: no placeholder left, and changing a
    constant changes the rendered SQL and so the layer's version."""
    files = dict(sqlfiles.idempotent_files())
    text = "".join(sqlfiles.render(p, embedding_dim=384) for p in files.values())
    assert "{{filter_" not in text
    for rel in ("filters/sql/search_filter.sql", "filters/sql/search_filter_value.sql",
                "filters/sql/search_filter_time.sql", "filters/sql/document_values.sql"):
        raw = files[rel].read_text(encoding="utf-8")
        assert "{{filter_" in raw, rel
        for literal in ("> 16", "and 100", "> 256", "1e308", "{0,63}"):
            assert literal not in raw, (rel, literal)
    before = sqlfiles.layer_version(embedding_dim=384)
    old = filters.MAX_IN
    try:
        filters.MAX_IN = old + 1
        assert sqlfiles.layer_version(embedding_dim=384) != before
    finally:
        filters.MAX_IN = old
    assert sqlfiles.layer_version(embedding_dim=384) == before


HOSTILE = '{%s}' % ", ".join('"k%d": {"$in": [%s]}' % (i, ", ".join(["1e100000"] * 100)) for i in range(16))


def test_sql_reader_gets_22023_for_unbounded_numbers(owner_url, owner_conn):
    """As a per-tenant SQL reader (kb-rerank sql-access): numbers beyond a double and an
    overflowing date are refused with 22023 naming the field, before any text is made of them."""
    from kb_rerank.db import database as db
    from kb_rerank.db import sql_access

    tenant = uuid.uuid4()
    role, pw = f"kb_test_reader_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    sql_access.grant(owner_conn, tenant, role=role, password=pw, app_role="kb_app")
    owner_conn.commit()
    try:
        with psycopg.connect(db.replace_url(owner_url, user=role, password=pw)) as conn:
            for sql, args, field in (
                    ("select kb.search_filter_docs(%s::jsonb)", [HOSTILE], "filter.k0.$in"),
                    ("select kb.search_filter(%s::jsonb)", ['{"v": {"$lt": -1e100000}}'], "filter.v.$lt"),
                    ("select kb.search_filter(%s::jsonb)", ['{"v": %s}' % ("9" * 401)], "filter.v"),
                    ("select kb.search_filter_docs(%s)",
                     [Jsonb({"updated_at": {"$gte": "9999-12-31T23:59:59.999999-23:59"}})], "filter.updated_at.$gte")):
                with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
                    conn.execute(sql, args)
                assert err.value.diag.column_name == field
                conn.rollback()
            # an ordinary filter runs for the reader, over its tenant only
            assert conn.execute("select kb.search_filter_docs(%s)", [Jsonb({"v": {"$gte": 1}})]).fetchone()[0] == []
    finally:
        sql_access.revoke(owner_conn, role=role)
        owner_conn.commit()


def test_rest_refuses_overflowing_numbers_and_dates_naming_the_field(settings):
    """Over REST: the 422 body names the field (the parse step every JSON route uses)."""
    from kb_rerank.http.body import ApiError
    from kb_rerank.endpoints.parse import rerank_request

    for text, field in (('{"v": %s}' % ("9" * 401), "filter.v"),
                        ('{"updated_at": {"$gte": "9999-12-31T23:59:59.999999-23:59"}}', "filter.updated_at.$gte"),
                        ('{"updated_at": "0001-01-01T00:00+23:59"}', "filter.updated_at")):
        body = ('{"query": "invoices", "filter": %s}' % text).encode()
        with pytest.raises(ApiError) as exc:
            rerank_request(body, settings)
        assert exc.value.status_code == 422 and exc.value.payload["field"] == field, exc.value.payload


def test_tenant_of_the_probe_connection_is_irrelevant(app_conn):
    """kb.search_filter depends on its argument only: the same answer in any tenant."""
    t = uuid.uuid4()
    with tenant_transaction(app_conn, t):
        a = app_conn.execute("select kb.search_filter(%s)", [Jsonb({"language": "JA"})]).fetchone()[0]
    assert a == {"language": {"$in": ["ja"]}}
