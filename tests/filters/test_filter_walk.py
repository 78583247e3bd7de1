"""A clearly broad filter on the semantic list: no listing of the filter's documents; the
HNSW walk checks each chunk it visits against its document (kb.search_semantic_ids with
kb.search_filter_docs_where), and that check says what the listing says.

A tenant counts as large by kb.corpus_stats (its chunk count): the tests here raise that
count on small tenants, so the broad path is taken without building a graph of 40,000
chunks; what the path returns is checked against the exact search all the same."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from kb_rerank.core import knn
from kb_rerank.core.session import tenant_transaction
from tests.filters.test_filters import _broad_tenant, _exact, _explained

LISTING = "coalesce(array_agg(d.doc_id order by d.doc_id)"  # kb.search_filter_docs' statement
SAMPLE = "count(*) filter"  # the walk's sample of the tenant's chunks
WALK = "array_agg(nn.chunk_id"  # the walk with the per-chunk check


def _call(owner_url, t, v, f, k, **kw):
    """_explained's (chunk ids, plans, exact list), the plans of the call's own statements only
    (logged as each ends: before the call's own plan, not the exact search's that follow)."""
    sem, text, exact = _explained(owner_url, t, v, f, k, **kw)
    return sem, text.split("Query Text: select chunk_id from kb.search_semantic_ids")[0], exact


def _count_as_large(owner_url, t, chunks=1_000_000):
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("update kb.corpus_stats set n_chunks = %s where tenant_id = %s", [chunks, t])


def _vector(conn, t, offset):
    with tenant_transaction(conn, t):
        return conn.execute("select embedding from kb.chunks where tenant_id = %s order by chunk_id offset %s limit 1",
                            [t, offset]).fetchone()[0]


@pytest.fixture(scope="module")
def broad(app_url, owner_url):
    """A tenant of 300 documents (3,000 chunks), 4 in 5 tagged "wide", counted as large."""
    with psycopg.connect(app_url) as conn:
        t = _broad_tenant(conn, 300)
    _count_as_large(owner_url, t)
    return t


def test_a_broad_filter_walks_without_listing_and_stays_within_it(app_url, owner_url, broad):
    """The filter's documents are not listed: the sample, then the walk with each chunk's
    document checked (the HNSW index scan, documents by their primary key); the list is k
    deep, within the filter, and keeps recall against the exact filtered search."""
    f = Jsonb({"tags": "wide"})
    with psycopg.connect(app_url) as conn:
        v = _vector(conn, broad, 7)
    sem, text, exact = _call(owner_url, broad, v, f, 60, sort=False)
    assert SAMPLE in text and WALK in text and LISTING not in text, text[-3000:]
    assert "Index Scan using chunks_embedding_hnsw_idx" in text and "documents_pkey" in text, text[-3000:]
    assert len(sem) == 60 and len(set(sem)) == 60
    with psycopg.connect(app_url) as conn, tenant_transaction(conn, broad):
        wide = {r[0] for r in conn.execute("select unnest(kb.search_filter_docs(%s))", [f])}
        recalls = []
        for i in range(6):
            v = _vector(conn, broad, i * 211)
            rows = conn.execute("select chunk_id, doc_id, score, rank from kb.search_semantic_ids(%s, 60, %s)",
                                [v, f]).fetchall()
            assert [r[3] for r in rows] == list(range(1, 61))
            assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
            assert {r[1] for r in rows} <= wide
            recalls.append(len({r[0] for r in rows} & set(_exact(conn, f, v, 60))) / 60)
    assert sum(recalls) / len(recalls) >= 0.9, recalls


def test_a_narrow_filter_on_a_large_tenant_is_listed(app_url, owner_url, broad):
    """The sample decides: a filter of 1 % of a large tenant's documents is listed first, as
    before, and its list is the exact one."""
    with psycopg.connect(app_url) as conn:
        v = _vector(conn, broad, 3)
    f = Jsonb({"source_path": {"$in": [f"d{i}" for i in range(1, 4)]}})
    sem, text, exact = _call(owner_url, broad, v, f, 20)
    assert SAMPLE in text and WALK not in text and LISTING in text, text[-3000:]
    assert sem == exact and len(sem) == 20


def test_a_filter_narrower_than_its_sample_is_answered_by_the_listing(app_url, owner_url):
    """The sample names the query's point in the chunk ids (md5 of the vector's bytes): chunks made to
    sit there, all of the filter's, make a narrow filter look broad. The walk finds fewer
    than k of them (there are fewer than k), and the listing answers: the exact list."""
    t = uuid.uuid4()
    with psycopg.connect(app_url) as conn:
        with tenant_transaction(conn, t):
            v = conn.execute("select (select array_agg(cos(g * 1.3))::real[] from generate_series(1, 384) g)::vector"
                             ).fetchone()[0]
            start = uuid.UUID(conn.execute("select md5(vector_send(%s::vector))", [v]).fetchone()[0])
            conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash, metadata)"
                         " select kb.current_tenant(), 'n' || i, '', repeat('0', 64),"
                         "        jsonb_build_object('tags', case when i <= 10 then 'rare' else 'common' end)"
                         " from generate_series(1, 60) as i")
            # 100 chunks of the "rare" documents right after the sample's start, 500 others after them
            docs = conn.execute("select doc_id, metadata ->> 'tags' from kb.documents order by source_uri collate \"C\""
                                ).fetchall()
            rows = []
            i = 0
            for doc, tag in sorted(docs, key=lambda r: r[1] != "rare"):
                for p in range(10):
                    rows.append((uuid.UUID(int=start.int + 1 + i), doc, p))
                    i += 1
            with conn.cursor() as cur:
                cur.executemany(
                    "insert into kb.chunks (tenant_id, chunk_id, doc_id, position, content, content_hash, embedding)"
                    " select kb.current_tenant(), %s, %s, %s, 'w', repeat('0', 64),"
                    "        (select array_agg(cos(g * (1 + x.r)) + 0.1 * random())::real[]"
                    "         from (select random() as r) x, generate_series(1, 384) g)::vector", rows)
        conn.commit()
    _count_as_large(owner_url, t)
    f = Jsonb({"tags": "rare"})
    sem, text, exact = _call(owner_url, t, v, f, 120)
    assert SAMPLE in text and WALK in text and LISTING in text, text[-3000:]  # walked, came back short, listed
    assert len(exact) == 100 and sem == exact


def test_another_tenants_documents_never_match_on_the_walk(app_url, owner_url, broad):
    """Tenant B holds copies of A's chunks (the same vectors, the same tags): A's broad walk
    returns A's chunks only, and B's returns B's."""
    b = uuid.uuid4()
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("insert into kb.documents (tenant_id, doc_id, source_uri, title, content_hash, metadata)"
                     " select %s, gen_random_uuid(), source_uri, title, content_hash, metadata from kb.documents"
                     " where tenant_id = %s", [b, broad])
        conn.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                     " select %s, db.doc_id, c.position, c.content, c.content_hash, c.embedding"
                     " from kb.chunks c join kb.documents da on da.tenant_id = c.tenant_id and da.doc_id = c.doc_id"
                     " join kb.documents db on db.tenant_id = %s and db.source_uri = da.source_uri"
                     " where c.tenant_id = %s", [b, b, broad])
    _count_as_large(owner_url, b)
    f = Jsonb({"tags": "wide"})
    with psycopg.connect(app_url) as conn:
        v = _vector(conn, broad, 11)
        for t in (broad, b):
            with tenant_transaction(conn, t):
                got = [r[0] for r in conn.execute("select doc_id from kb.search_semantic_ids(%s, 60, %s)", [v, f])]
                mine = {r[0] for r in conn.execute("select doc_id from kb.documents where tenant_id = %s", [t])}
            assert len(got) == 60 and set(got) <= mine
    sem, text, _ = _call(owner_url, b, v, f, 60, sort=False)
    assert WALK in text and LISTING not in text, text[-3000:]


# (filter, document numbers it selects) over _kinds' 24 documents: i = 0..23, title "t{i % 3}",
# language "en" for even i else "de", source_uri "k{i}", updated_at 2024-01-{i + 1},
# metadata {"n": i, "tag": "a" when i % 4 = 0 else "b", "list": [i % 5, "x"], "day": 2023-03-{i + 1}}
KINDS = [
    ({"title": "t1"}, {i for i in range(24) if i % 3 == 1}),
    ({"language": {"$in": ["de"]}}, {i for i in range(24) if i % 2}),
    ({"source_path": {"$in": ["k3", "k9", "nope"]}}, {3, 9}),
    ({"updated_at": {"$gte": "2024-01-05", "$lt": "2024-01-09"}}, {4, 5, 6, 7}),
    ({"updated_at": "2024-01-03"}, {2}),
    ({"tag": "a"}, {i for i in range(24) if i % 4 == 0}),
    ({"tag": {"$in": ["a", "zz"]}, "title": "t0"}, {i for i in range(24) if i % 12 == 0}),
    ({"list": 3}, {i for i in range(24) if i % 5 == 3}),
    ({"n": {"$gt": 5, "$lte": 9}}, {6, 7, 8, 9}),
    ({"n": {"$lt": 2}}, {0, 1}),
    ({"day": {"$gte": "2023-03-20T00:00:00Z"}}, set(range(19, 24))),
    ({"day": {"$gt": "2023-03-02"}, "n": {"$lte": 4}, "tag": "b"}, {2, 3}),
    ({"n": {"$gte": 100}}, set()),
]


@pytest.fixture(scope="module")
def kinds(app_url):
    t = uuid.uuid4()
    with psycopg.connect(app_url) as conn:
        with tenant_transaction(conn, t):
            conn.execute(
                "insert into kb.documents (tenant_id, source_uri, title, language, content_hash, updated_at, metadata)"
                " select kb.current_tenant(), 'k' || i, 't' || (i % 3), case when i % 2 = 0 then 'en' else 'de' end,"
                "        repeat('0', 64), timestamptz '2024-01-01 00:00:00+00' + i * interval '1 day',"
                "        jsonb_build_object('n', i, 'tag', case when i % 4 = 0 then 'a' else 'b' end,"
                "                           'list', jsonb_build_array(i % 5, 'x'),"
                "                           'day', to_char(date '2023-03-01' + i, 'YYYY-MM-DD'))"
                " from generate_series(0, 23) as i")
        conn.commit()
    return t


@pytest.mark.parametrize("f, expected", KINDS, ids=[str(f) for f, _ in KINDS])
def test_the_per_document_check_says_what_the_listing_says(owner_url, app_url, kinds, f, expected):
    """kb.search_filter_docs_where on each document, its ranges checked on the document's own
    kb.document_values rows (the walk's form), selects the documents kb.search_filter_docs
    lists (its ranges listed beforehand by btree range scans), for every kind of field."""
    with psycopg.connect(app_url) as conn, tenant_transaction(conn, kinds):
        listed = {r[0] for r in conn.execute("select unnest(kb.search_filter_docs(%s))", [Jsonb(f)])}
        names = dict(conn.execute("select doc_id, source_uri from kb.documents").fetchall())
    assert {int(names[d][1:]) for d in listed} == expected
    with psycopg.connect(owner_url) as conn:
        canon = conn.execute("select kb.search_filter(%s)", [Jsonb(f)]).fetchone()[0]
        a = conn.execute("select * from kb.search_filter_docs_args(%s)", [Jsonb(canon)]).fetchone()
        where = conn.execute("select kb.search_filter_docs_where()").fetchone()[0]
        # the walk's form: $2 (listed ranges) NULL, $17 the ranges checked on the row; the
        # values bound by the client (its %(pN)s for the statement's $N)
        args = [a[0], None, *a[1:14], kinds, Jsonb(a[14]) if a[14] is not None else None]
        stmt = ("select d.doc_id from kb.documents d where d.tenant_id = %(p16)s and "
                + re.sub(r"\$(\d+)", lambda m: f"%(p{m[1]})s", where))
        checked = {r[0] for r in psycopg.ClientCursor(conn).execute(
            stmt, {f"p{i + 1}": x for i, x in enumerate(args)})}
    assert checked == listed

