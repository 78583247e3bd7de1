"""bench/mixed_tenants.py's fill_vectors: a tenant loaded with stand-in vectors gets the
embedder's, in place, and nothing else of the tenant changes (its lexical index, statistics)."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

from kb_rerank.eval.measures import load_beir
from kb_rerank.eval.runs import evaluate_collection, source_docs
from kb_rerank.ingest.loader import ingest_documents, passage_text

from tests.eval.test_eval_runs import DOCS, _write_beir, beir_dir, eval_settings, factory  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("mixed_tenants_bench", ROOT / "bench" / "mixed_tenants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _state(owner_url, tenant):
    with psycopg.connect(owner_url) as conn:
        register_vector(conn)
        vectors = {cid: (title, content, np.asarray(e.to_numpy(), dtype=np.float32)) for cid, title, content, e in
                   conn.execute("select c.chunk_id, d.title, c.content, c.embedding from kb.chunks c join"
                                " kb.documents d on d.doc_id = c.doc_id where c.tenant_id = %s", [tenant])}
        derived = conn.execute(
            "select (select md5(string_agg(t::text, '|' order by t::text)) from kb.term_blocks t where tenant_id = %s),"
            " (select md5(string_agg(s::text, '|' order by s::text)) from kb.corpus_stats s where tenant_id = %s),"
            " (select md5(string_agg(c.tsv::text || c.doc_len, '|' order by c.chunk_id)) from kb.chunks c"
            "  where tenant_id = %s)", [tenant, tenant, tenant]).fetchone()
    return vectors, derived


def test_fill_vectors_writes_the_embedders_vectors_and_nothing_else(bench, eval_settings, beir_dir, embedder,
                                                                   factory):  # noqa: F811 - fixtures
    tenant = uuid.uuid4()
    stand_in = bench.StandIn(embedder.dim)
    with factory() as conn:
        ingest_documents(conn, tenant, source_docs(load_beir(beir_dir), "beir:tiny/"), stand_in, eval_settings)
    before, derived = _state(eval_settings.database_url, tenant)
    assert before and all(np.allclose(v, stand_in.embed_passages([passage_text(t, c)])[0])
                          for t, c, v in before.values())
    lexical = evaluate_collection(eval_settings, beir_dir, "lexical", embedder=stand_in, conn_factory=factory,
                                  cache=False, tenant=tenant, doc_prefix="beir:tiny/")

    out = bench.fill_vectors(eval_settings, tenant, embedder)
    assert out["chunks"] == len(before) and out["vectors_written"] == len(before)
    after, derived_after = _state(eval_settings.database_url, tenant)
    for cid, (title, content, v) in after.items():
        expected = np.asarray(embedder.embed_passages([passage_text(title, content)])[0], dtype=np.float32)
        assert np.allclose(v, expected, atol=1e-6), cid
    assert derived_after == derived  # the lexical index and statistics untouched: no trigger counted the update
    again = evaluate_collection(eval_settings, beir_dir, "lexical", embedder=stand_in, conn_factory=factory,
                                cache=False, tenant=tenant, doc_prefix="beir:tiny/")
    assert again["run"] == lexical["run"]
    semantic = evaluate_collection(eval_settings, beir_dir, "semantic", embedder=embedder, conn_factory=factory,
                                   cache=False, tenant=tenant, doc_prefix="beir:tiny/")
    assert semantic["run"]["q1"][0] == "photo"  # real vectors now: the photosynthesis page nearest its question

    assert bench.fill_vectors(eval_settings, tenant, embedder)["vectors_written"] == 0  # a second run resumes


def test_hybrid_without_the_deep_recall_search(eval_settings, beir_dir, embedder, factory,  # noqa: F811
                                               monkeypatch):
    """deep_recall=False: the same ranked lists and nDCG, one search per query instead of two."""
    from kb_rerank.core import session

    calls = []
    real = session.run
    monkeypatch.setattr(session, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    deep = evaluate_collection(eval_settings, beir_dir, "hybrid", embedder=embedder, conn_factory=factory)
    n_deep = len(calls)
    calls.clear()
    quick = evaluate_collection(eval_settings, beir_dir, "hybrid", embedder=embedder, conn_factory=factory,
                                deep_recall=False)
    assert quick["run"] == deep["run"] and quick["ndcg@10"] == deep["ndcg@10"]
    assert n_deep - len(calls) == deep["num_queries"] > 0
