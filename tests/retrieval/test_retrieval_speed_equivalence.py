"""The faster read of a hybrid miss returns what the functions it replaces return.

kb.retrieve_hybrid (retrieval/sql/retrieve_hybrid.sql) is the service's hybrid read in one
statement: kb.search_hybrid's first ``lim`` rows with their live pair scores. It fuses the
text-free lists kb.search_lexical_ids and kb.search_semantic_ids and reads the texts of the
rows it returns only. Here, on a seeded corpus built to have ties (repeated texts, repeated
vectors, one document with many close chunks, term blocks for its common words), every
column of every row is compared with the reference: kb.search_hybrid (whose values other
tests check by hand) cut to ``lim`` rows, for every fusion, several k and lim; the split
lexical search with its old one-function form (its texts), the text-free semantic list with
kb.search_semantic; and the pair scores read in the statement with pair_cache.get_live.
No timing: speed is measured by bench/service_bench.py only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import uuid

import numpy as np
import psycopg
import pytest

from kb_rerank.retrieval.spec import HYBRID, LEXICAL, RetrievalSpec
from kb_rerank.core.settings import Settings
from kb_rerank.rerank import pair_cache
from kb_rerank.retrieval import store as search
from kb_rerank.core.session import AwaitedConnection, configure_connection, run_awaited, tenant_transaction

from tests.helpers import basis, insert_doc, unit

WORDS = ("walrus otter heron badger lynx marten stoat vole shrew ferret beaver mink"
         " river delta marsh reed stone cliff ridge glacier tundra taiga").split()
DIM = 384


class _Counting(AwaitedConnection):
    """The connection, keeping the text of every statement it runs (``seen``)."""

    def __init__(self, conn) -> None:
        super().__init__(conn)
        self.seen: list[str] = []

    async def execute(self, query, params=None):
        self.seen.append(query)
        return await super().execute(query, params)


def _corpus(conn, tenant, seed: int) -> None:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    centres = [unit(nrng.normal(size=DIM)) for _ in range(6)]
    shared_vec = unit(centres[0] + 0.1 * nrng.normal(size=DIM))
    for d in range(45):
        n = rng.randint(1, 6)
        texts, vecs = [], []
        for i in range(n):
            if d % 9 == 0:  # repeated texts across documents: lexical ties
                texts.append("walrus otter river walrus")
            else:
                texts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))))
            if d % 7 == 0 and i == 0:  # repeated vectors: semantic ties
                vecs.append(shared_vec)
            else:
                c = centres[rng.randrange(len(centres))]
                vecs.append(unit(c + 0.8 * nrng.normal(size=DIM) / np.sqrt(DIM) * 10))
        insert_doc(conn, tenant, f"Doc {d}", texts, vecs)
    # many close chunks of one document: the semantic list must read deeper for small k
    insert_doc(conn, tenant, "Crowd", [f"crowd part {i} heron" for i in range(12)],
               [unit(basis(30) + 0.01 * (i + 1) * basis(40 + i)) for i in range(12)])
    with tenant_transaction(conn, tenant):
        conn.execute("select kb.refresh_term_blocks(4, 3)")


@pytest.fixture(scope="module")
def corpus(app_url):
    """Two tenants with seeded corpora (the second one's rows must never show)."""
    a, other = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(app_url) as conn:
        configure_connection(conn)
        _corpus(conn, a, 1)
        _corpus(conn, other, 2)
    return a, other


def _queries(n: int, seed: int = 5):
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    out = [("walrus otter river", unit(nrng.normal(size=DIM))), ("heron", unit(basis(30) + basis(31))),
           ("zyxwv nothing matches", unit(nrng.normal(size=DIM))), ("", unit(nrng.normal(size=DIM)))]
    for _ in range(n):
        out.append((" ".join(rng.sample(WORDS, rng.randint(1, 4))), unit(nrng.normal(size=DIM))))
    return out


def _reference(conn, q, v, k, fusion, lim, lw=0.7, sw=0.3, rrf_k=10, filter=None):
    return conn.execute(search.HYBRID_TOP_SQL, [q, v, k, rrf_k, fusion, lw, sw, 1.2, 0.75, search._filter(filter),
                                                None, lim]).fetchall()


def _retrieve(conn, q, v, k, fusion, lim, lw=0.7, sw=0.3, rrf_k=10, pairs=(None, None, None), filter=None):
    return conn.execute(search.RETRIEVE_HYBRID_SQL, [q, v, k, rrf_k, fusion, lw, sw, 1.2, 0.75, lim, *pairs,
                                                     search._filter(filter), None, None, None, None]).fetchall()


@pytest.mark.parametrize("fusion", ["convex", "rrf", "interleave"])
def test_retrieve_hybrid_rows_equal_search_hybrid_cut_to_lim(app_conn, corpus, fusion):
    tenant, _ = corpus
    compared = 0
    with tenant_transaction(app_conn, tenant):
        for q, v in _queries(25):
            for k in (1, 2, 5, 20, 60):
                for lim in (1, 3, 2 * k):
                    ref = _reference(app_conn, q, v, k, fusion, lim)
                    got = _retrieve(app_conn, q, v, k, fusion, lim)
                    assert [tuple(r[:10]) for r in got] == [tuple(r) for r in ref], (q, k, lim)
                    assert all(r[10] is None for r in got)  # no pair key given: no pair score
                    compared += len(ref)
        # other weights and RRF constants
        for q, v in _queries(5, seed=9):
            for lw, sw, rrf_k in ((1.0, 1.0, 60), (0.0, 1.0, 0), (2.5, 0.5, 3)):
                ref = _reference(app_conn, q, v, 20, fusion, 40, lw, sw, rrf_k)
                got = _retrieve(app_conn, q, v, 20, fusion, 40, lw, sw, rrf_k)
                assert [tuple(r[:10]) for r in got] == [tuple(r) for r in ref], (q, lw, sw, rrf_k)
        # within a filter: the documents of some titles, inside both lists
        for q, v in _queries(5, seed=11):
            for f in ({"title": {"$in": [f"Doc {d}" for d in range(0, 45, 3)]}}, {"title": "Crowd"}):
                for k in (1, 5, 20):
                    ref = _reference(app_conn, q, v, k, fusion, 2 * k, filter=f)
                    got = _retrieve(app_conn, q, v, k, fusion, 2 * k, filter=f)
                    assert [tuple(r[:10]) for r in got] == [tuple(r) for r in ref], (q, f, k)
                    assert {r[2] for r in got} <= set(f["title"]["$in"] if "$in" in f["title"] else ["Crowd"])
                    compared += len(ref)
    assert compared > 1000  # not vacuous


def test_the_crowded_document_is_read_deeper_as_in_search_hybrid(app_conn, corpus):
    tenant, _ = corpus
    v = unit(basis(30) + basis(31))
    with tenant_transaction(app_conn, tenant):
        crowd = app_conn.execute("select count(*) from kb.search_semantic(%s::vector, 4) where doc_title = 'Crowd'",
                                 [v]).fetchone()[0]
        got = _retrieve(app_conn, "zyxwv", v, 2, "convex", 4)
        ref = _reference(app_conn, "zyxwv", v, 2, "convex", 4)
    assert crowd == 4  # the first 2k chunks hold one document: the list is read deeper
    assert [tuple(r[:10]) for r in got] == [tuple(r) for r in ref] and len(got) == 2


def test_text_free_lists_equal_the_lists_with_texts(app_conn, corpus):
    tenant, _ = corpus
    with tenant_transaction(app_conn, tenant):
        for q, v in _queries(20):
            for k in (1, 7, 60):
                lex = app_conn.execute("select chunk_id, doc_id, score, rank from kb.search_lexical(%s, %s)",
                                       [q, k]).fetchall()
                ids = app_conn.execute("select chunk_id, doc_id, score, rank from kb.search_lexical_ids(%s, %s)",
                                       [q, k]).fetchall()
                assert ids == lex
                sem = app_conn.execute("select chunk_id, doc_id, score, rank from kb.search_semantic(%s::vector, %s)",
                                       [v, k]).fetchall()
                sem_ids = app_conn.execute("select * from kb.search_semantic_ids(%s::vector, %s)", [v, k]).fetchall()
                assert sem_ids == sem
        # the texts kb.search_lexical adds are the chunk's and its document's
        rows = app_conn.execute(
            "select l.doc_title = d.title, l.content = c.content, l.snippet = left(c.content, 300)"
            " from kb.search_lexical('walrus otter', 60) l join kb.chunks c on c.chunk_id = l.chunk_id"
            " join kb.documents d on d.doc_id = l.doc_id").fetchall()
    assert rows and all(all(r) for r in rows)


def test_nothing_without_a_tenant_and_nothing_of_another_tenant(app_conn, corpus):
    tenant, other = corpus
    v = unit(basis(30) + basis(31))
    with app_conn.transaction():
        assert _retrieve(app_conn, "walrus", v, 20, "convex", 40) == []
        assert app_conn.execute("select count(*) from kb.search_lexical_ids('walrus', 20)").fetchone()[0] == 0
        assert app_conn.execute("select count(*) from kb.search_semantic_ids(%s::vector, 20)", [v]).fetchone()[0] == 0
    with tenant_transaction(app_conn, tenant):
        mine = {r[0] for r in _retrieve(app_conn, "walrus otter heron", v, 60, "convex", 120)}
    with tenant_transaction(app_conn, other):
        theirs = {r[0] for r in _retrieve(app_conn, "walrus otter heron", v, 60, "convex", 120)}
    assert mine and theirs and not mine & theirs


def _pair_row(conn, model, qh, generation, chunk_id, content, score, *, ttl="1 hour", content_hash=None):
    conn.execute(
        "insert into kb.kb_rerank_pair_scores (tenant_id, model, query_hash, generation, chunk_id, content_hash,"
        " score, expires_at) values (kb.current_tenant(), %s, %s, %s, %s, %s, %s, now() + %s::interval)",
        [model, qh, generation, chunk_id, content_hash or hashlib.sha256(content.encode()).hexdigest(), score, ttl])


def test_pair_scores_read_in_the_statement_equal_get_live(app_conn, corpus):
    """Live rows only: not expired, this model, query hash and generation, the chunk's current
    text; and through RetrievalSpec.fetch (the service's read) the same dict as
    pair_cache.get_live over the same candidates."""
    tenant, other = corpus
    q, v = "walrus otter river", unit(basis(30) + basis(31))
    model, qh, gen = "tiny-model", "f" * 64, 3
    with tenant_transaction(app_conn, tenant):
        rows = _retrieve(app_conn, q, v, 20, "convex", 40)
        assert len(rows) >= 8
        c = [(r[0], r[4]) for r in rows]
        _pair_row(app_conn, model, qh, gen, *c[0], 0.25)                   # live
        _pair_row(app_conn, model, qh, gen, *c[1], 0.75)                   # live
        _pair_row(app_conn, model, qh, gen, *c[2], 0.5, ttl="-1 second")   # expired
        _pair_row(app_conn, model, qh, gen - 1, *c[3], 0.5)                # older generation
        _pair_row(app_conn, "other-model", qh, gen, *c[4], 0.5)            # another model
        _pair_row(app_conn, model, "e" * 64, gen, *c[5], 0.5)              # another query
        _pair_row(app_conn, model, qh, gen, *c[6], 0.5, content_hash="0" * 64)  # text changed since
    with tenant_transaction(app_conn, other):  # another tenant's row for the same chunk id and key
        _pair_row(app_conn, model, qh, gen, *c[7], 0.5)
    app_conn.commit()

    with tenant_transaction(app_conn, tenant):
        got = _retrieve(app_conn, q, v, 20, "convex", 40, pairs=(model, qh, gen))
        assert [tuple(r[:10]) for r in got] == [tuple(r[:10]) for r in rows]
        assert [r[10] for r in got[:8]] == [0.25, 0.75, None, None, None, None, None, None]
        assert all(r[10] is None for r in got[8:])

        spec = RetrievalSpec.of(Settings(), HYBRID)
        aconn = AwaitedConnection(app_conn)
        cands = run_awaited(spec.fetch(aconn, q, v, pairs=(model, qh), generation=gen))
        cached = cands.pair_scores
        keys = [pair_cache.content_key(x.chunk_id, x.content) for x in cands]
        live = run_awaited(pair_cache.get_live(aconn, model, qh, keys, generation=gen))
        assert cached == live == {pair_cache.content_key(*c[0]): 0.25, pair_cache.content_key(*c[1]): 0.75}
        # without a pair key: no pair read at all
        plain = run_awaited(spec.fetch(aconn, q, v))
        assert plain.pair_scores is None and [x.chunk_id for x in plain] == [x.chunk_id for x in cands]
        # another source reads the pair scores with its own statement, the same way
        lex = RetrievalSpec.of(Settings(), LEXICAL)
        lcands = run_awaited(lex.fetch(aconn, q, v, pairs=(model, qh), generation=gen))
        lcached = lcands.pair_scores
        lkeys = [pair_cache.content_key(x.chunk_id, x.content) for x in lcands]
        assert lcached == run_awaited(pair_cache.get_live(aconn, model, qh, lkeys, generation=gen))


def test_the_service_reads_candidates_and_pair_scores_in_one_statement(app_conn, corpus):
    """retrieval.read on the primary: one statement for the hybrid candidates and their pair
    scores (kb.retrieve_hybrid), the candidates those of RetrievalSpec.fetch."""
    from kb_rerank.retrieval import spec as retrieval

    tenant, _ = corpus
    q, v = "heron badger", unit(basis(30) + basis(31))
    spec = RetrievalSpec.of(Settings(), HYBRID)
    with tenant_transaction(app_conn, tenant):
        counting = _Counting(app_conn)
        cands, cached = run_awaited(retrieval.read(counting, spec, q, v, generation=0, on_primary=True,
                                                   query_hash="h", pairs=("m", "d" * 64)))
        plain = run_awaited(spec.fetch(AwaitedConnection(app_conn), q, v))
    assert counting.seen == [search.RETRIEVE_HYBRID_SQL]
    assert cached == {} and [c.id for c in cands] == [c.id for c in plain] and len(cands) == spec.limit


@pytest.mark.parametrize("lim", [0, -1, 2001, None])
def test_lim_is_checked(app_conn, corpus, lim):
    tenant, _ = corpus
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="lim must be between 1 and 2000"):
        with tenant_transaction(app_conn, tenant):
            _retrieve(app_conn, "walrus", basis(0), 20, "convex", lim)


@pytest.mark.parametrize("args, message", [
    ((0, 10, "rrf"), "k must be between 1 and 1000"),
    ((20, -1, "rrf"), "rrf_k must be >= 0"),
    ((20, 10, "bogus"), "fusion must be"),
])
def test_arguments_are_checked_as_search_hybrid_checks_them(app_conn, corpus, args, message):
    tenant, _ = corpus
    k, rrf_k, fusion = args
    for fn in (_reference, _retrieve):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            with tenant_transaction(app_conn, tenant):
                fn(app_conn, "walrus", basis(0), k, fusion, 5, rrf_k=rrf_k)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="convex fusion needs weights"):
            with tenant_transaction(app_conn, tenant):
                fn(app_conn, "walrus", basis(0), 20, "convex", 5, lw=0.0, sw=0.0)


def test_the_app_role_and_sql_readers_may_run_the_read_and_the_fusion(owner_conn):
    """The service's read, the fusion and the id lists it fuses are granted to the service's
    role and to kb_sql_reader (kb.search_hybrid and kb.rerank_search, which SQL readers call,
    run them as their caller, under the reader's tenant); none to PUBLIC."""
    fusion = ("kb.hybrid_fusion(text, vector, integer, integer, text, double precision, double precision,"
              " double precision, double precision, jsonb, text, uuid[], uuid[], double precision[])")
    for fn, sql_reader in (("kb.retrieve_hybrid(text, vector, integer, integer, text, double precision, double precision,"
                            " double precision, double precision, integer, text, text, bigint, jsonb, text, uuid[],"
                            " uuid[], double precision[])", True),
                           (fusion, True),
                           ("kb.search_lexical_ids(text, integer, double precision, double precision, jsonb, text)", True),
                           ("kb.search_semantic_ids(vector, integer, jsonb)", True)):
        assert owner_conn.execute("select has_function_privilege('kb_app', %s, 'EXECUTE'),"
                                  " has_function_privilege('kb_sql_reader', %s, 'EXECUTE'),"
                                  " has_function_privilege('public', %s, 'EXECUTE')",
                                  [fn, fn, fn]).fetchone() == (True, sql_reader, False), fn
    rows = owner_conn.execute(
        "select p.proname, p.prosecdef, r.rolname, p.provolatile from pg_proc p join pg_roles r on r.oid = p.proowner"
        " where p.pronamespace = 'kb'::regnamespace"
        " and p.proname in ('hybrid_fusion', 'retrieve_hybrid', 'search_lexical_ids', 'search_semantic_ids',"
        " 'search_lexical') order by 1").fetchall()
    assert rows == [("hybrid_fusion", False, rows[0][2], "s"),
                    ("retrieve_hybrid", False, rows[0][2], "s"), ("search_lexical", True, "kb_search", "s"),
                    ("search_lexical_ids", True, "kb_search", "s"), ("search_semantic_ids", True, "kb_search", "s")]


def test_async_read_path_runs_on_a_real_async_connection(app_url, corpus):
    """RetrievalSpec.fetch on psycopg's AsyncConnection (the service's), not only through
    the synchronous adapter the CLI and eval use."""
    tenant, _ = corpus
    from kb_rerank.core.session import aconfigure_connection, atenant_transaction

    async def go():
        async with await psycopg.AsyncConnection.connect(app_url, autocommit=True) as conn:
            await aconfigure_connection(conn)
            async with atenant_transaction(conn, tenant):
                return await RetrievalSpec.of(Settings(), HYBRID).fetch(
                    conn, "walrus otter", unit(basis(30) + basis(31)), pairs=("m", "c" * 64), generation=0)

    cands = asyncio.run(go())
    assert cands and cands.pair_scores == {}


# The read given its lexical list (read beforehand in a transaction of its own, as a hybrid
# miss reads it while the query is being embedded) against today's one-statement read: every
# fusion, with and without a filter, with a named, a guessed and no language. One table.
GIVEN_LIST_CASES = [
    (fusion, flt, language)
    for fusion in ("rrf", "convex", "interleave")
    for flt in (None, {"title": {"$in": [f"Doc {d}" for d in range(0, 45, 3)] + ["Crowd"]}})
    for language in (None, "en", "de")
]
# guessed languages: English and German words, sure and weak guesses, and none at all
GUESSED = ["the river and the otter", "river delta marsh", "der Fluss und die Otter im Schilf", "walrus", "heron badger lynx marten",
           "la rivière et la loutre", "zyxwv nothing matches", ""]


@pytest.mark.parametrize("fusion, flt, language", GIVEN_LIST_CASES)
def test_the_read_given_its_lexical_list_returns_the_rows_of_the_one_statement_read(app_conn, corpus, fusion,
                                                                                       flt, language):
    from kb_rerank.retrieval.spec import read as read_spec

    tenant, _ = corpus
    settings = Settings()
    spec = RetrievalSpec.of(settings, HYBRID, filter=flt, language=language)
    spec = dataclasses.replace(spec, fusion={**spec.fusion, "fusion": fusion})
    queries = [(q, v) for q, v in _queries(12, seed=17)] + [(q, unit(basis(30) + basis(i))) for i, q in
                                                            enumerate(GUESSED)]
    compared = 0
    for q, v in queries:
        for depth in (spec.depth, 5):
            sp = dataclasses.replace(spec, depth=depth, limit=2 * depth)
            with tenant_transaction(app_conn, tenant):
                lexical = run_awaited(sp.lexical_list(AwaitedConnection(app_conn), q))
            args = dict(generation=0, on_primary=True, query_hash="h", pairs=("m", "d" * 64))
            with tenant_transaction(app_conn, tenant):
                ref, ref_pairs = run_awaited(read_spec(AwaitedConnection(app_conn), sp, q, v, **args))
            with tenant_transaction(app_conn, tenant):
                got, got_pairs = run_awaited(read_spec(AwaitedConnection(app_conn), sp, q, v, lexical=lexical,
                                                       **args))
            assert [vars(c) for c in got] == [vars(c) for c in ref], (q, depth)
            assert got_pairs == ref_pairs
            compared += len(ref)
    assert compared > 200  # not vacuous


def test_the_read_given_its_lexical_list_runs_no_lexical_search(app_conn, corpus):
    """Given the list, the read neither searches again nor decides the language again."""
    from kb_rerank.retrieval import spec as retrieval

    tenant, _ = corpus
    q, v = "der Fluss und die Otter im Schilf", unit(basis(30) + basis(31))
    spec = RetrievalSpec.of(Settings(), HYBRID)
    with tenant_transaction(app_conn, tenant):
        lexical = run_awaited(spec.lexical_list(AwaitedConnection(app_conn), q))
    with tenant_transaction(app_conn, tenant):
        counting = _Counting(app_conn)
        run_awaited(retrieval.read(counting, spec, q, v, generation=0, on_primary=True, query_hash="h",
                                   pairs=None, lexical=lexical))
    assert counting.seen == [search.RETRIEVE_HYBRID_SQL]


@pytest.mark.parametrize("chunks, docs, scores", [
    (2, 1, 2), (2, 2, 1), (2, None, 2), (21, 21, 21),
])
def test_a_given_lexical_list_is_checked(app_conn, corpus, chunks, docs, scores):
    """Three arrays of one length, at most k (20 here): else a plain 22023 error."""
    tenant, _ = corpus

    def arr(n, make):
        return None if n is None else [make() for _ in range(n)]

    given = [arr(chunks, uuid.uuid4), arr(docs, uuid.uuid4), arr(scores, random.random)]
    for fn in ("kb.hybrid_fusion('walrus', %s::vector, 20, 10, 'rrf', 1, 1, 1.2, 0.75, null, null,"
               " %s::uuid[], %s::uuid[], %s::float8[])",
               "kb.retrieve_hybrid('walrus', %s::vector, 20, 10, 'rrf', 1, 1, 1.2, 0.75, 40, null, null, null, null,"
               " null, %s::uuid[], %s::uuid[], %s::float8[])"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="a given lexical list needs"):
            with tenant_transaction(app_conn, tenant):
                app_conn.execute(f"select * from {fn}", [basis(0), *given])


def test_a_forged_lexical_list_shows_nothing_of_another_tenant(app_conn, corpus):
    """Another tenant's chunk ids given as the lexical list: fused as given, but no text, no
    row of the read (kb.chunk_texts reads the caller's tenant only)."""
    tenant, other = corpus
    with tenant_transaction(app_conn, other):
        theirs = app_conn.execute("select chunk_id, doc_id from kb.chunks limit 5").fetchall()
    assert theirs
    given = [[c for c, _ in theirs], [d for _, d in theirs], [1.0] * len(theirs)]
    with tenant_transaction(app_conn, tenant):
        rows = app_conn.execute(search.RETRIEVE_HYBRID_SQL, ["zyxwv", basis(0), 20, 10, "rrf", 1, 1, 1.2, 0.75, 40,
                                                             None, None, None, None, None, *given]).fetchall()
    assert rows and not {r[0] for r in rows} & {c for c, _ in theirs}
