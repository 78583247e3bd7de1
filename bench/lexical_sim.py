"""How many chunks kb.search_lexical scores per query, simulated in Python on a real tenant.

The work of an exact top-k BM25 query is mostly the chunks it scores (each costs a few
microseconds in SQL: heap read, term frequencies, aggregation). This script replays the
staged pruning of retrieval/sql/search_lexical.sql on the term postings of one tenant
of a database loaded by bench/search_bench.py, with the same queries as that benchmark, and
prints percentiles of chunks scored for several variants of the rules. Every variant's top
k is checked against exhaustive BM25 (an assertion), so a variant that prunes wrongly fails.
It was used to choose the rules about champion lists (kb.term_tops of 0008, the term blocks'
first form); the SQL comments quote its figures.

    python bench/lexical_sim.py extract --db kb_bench_100000_10 --tenant 0 --out /tmp/t34k.pkl
    python bench/lexical_sim.py simulate /tmp/t34k.pkl

Variants (all exact):
  exhaustive        every chunk holding a query term
  no lists          staged MaxScore with term pairs (P: terms in < N/4 of the chunks)
  lists, N/4        + stage 0: rare terms' chunks and the champion lists; tail bounds
  lists, N/8        + listed terms in >= N/8 of the chunks are bounded, not paired
  lists, N/8, pairs + a stage without essential terms when its pairs look cheap
  merged, N/8, pairs the same, but the listed chunks join the first stage instead of a
                    stage 0 of their own (production: the rare terms beyond the essential
                    postings are paired, not all scored; see bench/lexical_ab.py for time)
  merged, N/4, pairs the same with the quarter rule for listed terms
"""

from __future__ import annotations

import argparse
import math
import pickle
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
K1, B = 1.2, 0.75


def extract(args) -> int:
    import psycopg

    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "src"))
    import search_bench as sb

    sents, _ = sb.load_sentences(args.text_from)
    centres = sb.make_centres()
    # the queries search_bench.py measures on this tenant (same seeds)
    queries = [q for q, _ in sb.tenant_queries(args.tenant, sents, centres, args.queries)]
    url = f"postgresql://postgres@/{args.db}?host={args.host}"
    with psycopg.connect(url, autocommit=True) as c:
        t = c.execute("select tenant_id from kb.corpus_stats order by n_chunks desc").fetchall()[args.tenant][0]
        n, tot = c.execute("select n_chunks, total_len from kb.corpus_stats where tenant_id = %s", [t]).fetchone()
        qterms = [c.execute("select q.term, q.qtf, coalesce(ts.df, 0) from kb.query_term_counts(%s) q"
                            " left join kb.term_stats ts on ts.tenant_id = %s and ts.term = q.term", [q, t]).fetchall()
                  for q in queries]
        terms = sorted({r[0] for rows in qterms for r in rows})
        chunks = c.execute("select chunk_id::text, doc_id::text, doc_len from kb.chunks where tenant_id = %s"
                           " order by chunk_id", [t]).fetchall()
        post = c.execute("select c.chunk_id::text, u.lexeme, coalesce(array_length(u.positions, 1), 1)"
                         " from kb.chunks c cross join lateral unnest(ts_filter(setweight(c.tsv, 'A', %s::text[]),"
                         " '{a}')) u where c.tenant_id = %s", [terms, t]).fetchall()
    with open(args.out, "wb") as f:
        pickle.dump(dict(n=n, tot=tot, queries=queries, qterms=qterms, chunks=chunks, post=post), f)
    print(f"{args.out}: {n} chunks, {len(terms)} query terms, {len(post)} postings")
    return 0


class Tenant:
    def __init__(self, d: dict):
        self.n, self.avg = d["n"], d["tot"] / d["n"]
        ids = [c[0] for c in d["chunks"]]  # sorted: index order = chunk_id order
        ix = {c: i for i, c in enumerate(ids)}
        docs: dict = {}
        self.doc = np.array([docs.setdefault(c[1], len(docs)) for c in d["chunks"]])
        self.dl = np.array([c[2] for c in d["chunks"]], float)
        raw = defaultdict(lambda: ([], []))
        for c, lex, tf in d["post"]:
            raw[lex][0].append(ix[c])
            raw[lex][1].append(tf)
        self.post = {}
        for lex, (ci, tf) in raw.items():
            ci, tf = np.array(ci), np.array(tf, float)
            g = tf * (K1 + 1) / (tf + K1 * (1 - B + B * self.dl[ci] / self.avg))
            o = np.lexsort((ci, -g))  # impact order, ties by chunk id: a champion list is a prefix
            self.post[lex] = (ci[o], g[o])
        self.sets = {t: set(ci.tolist()) for t, (ci, _) in self.post.items()}

    def topk(self, cands, terms, k):
        cands = np.array(sorted(cands), dtype=int)
        mask = np.zeros(len(self.dl), bool)
        mask[cands] = True
        sc = np.zeros(len(self.dl))
        for t, w in terms:
            ci, g = self.post[t]
            m = mask[ci]
            sc[ci[m]] += w * g[m]
        s = np.round(sc[cands], 9)
        out, seen = [], set()
        for j in np.lexsort((cands, -s)):  # best chunk per document
            d = self.doc[cands[j]]
            if d not in seen:
                seen.add(d)
                out.append(s[j])
                if len(out) == k:
                    break
        return out


def staged(tn: Tenant, terms, k, *, lists=None, tails=None, frac=4.0, zero_stage=False, first=1000, merged=False):
    """The stages of kb.search_lexical; returns (top-k scores, chunks scored)."""
    terms = sorted(terms, key=lambda tw: (len(tn.post[tw[0]][0]), tw[0]))
    df = [len(tn.post[t][0]) for t, _ in terms]
    listed = [bool(lists) and t in lists for t, _ in terms]
    u = [w * (tails[t] if listed[i] else K1 + 1) for i, (t, w) in enumerate(terms)]
    nt, n = len(terms), tn.n
    scored: set = set()
    top: list = []

    def run(cands, bound):
        nonlocal top
        scored.update(cands)
        top = tn.topk(scored, terms, k)
        return len(top) == k and top[-1] > bound + 1e-8

    if lists and any(listed) and not merged:  # stage 0
        c = set()
        for i, (t, _) in enumerate(terms):
            c |= lists[t] if listed[i] else tn.sets[t]
        if run(c, sum(u[i] for i in range(nt) if listed[i])):
            return top, len(scored)
    ne, cum = 1, df[0]
    while ne < nt and cum + df[ne] < first:
        ne, cum = ne + 1, cum + df[ne]
    if lists and any(listed) and zero_stage and listed[0] and df[0] >= first:
        p0 = [i for i in range(nt) if df[i] < n / 4][:8]
        if sum(df[a] * df[b] / n for x, a in enumerate(p0) for b in p0[x + 1:]) < 0.5 * df[0]:
            ne, cum = 0, 0
    while lists and any(listed) and ne < nt and not listed[ne]:
        ne, cum = ne + 1, cum + df[ne]
    while True:
        p, pmax, bound = [], 0.0, 0.0
        for i in range(ne, nt):
            if len(p) < 8 and df[i] < n / 4 and (ne == 0 or not (listed[i] and df[i] >= n / frac)):
                p.append(i)
                pmax = max(pmax, u[i])
            else:
                bound += u[i]
        c = set().union(*(tn.sets[terms[i][0]] for i in range(ne))) if ne else set()
        if merged and lists and not scored:  # the first stage also scores the listed chunks
            for i, (t, _) in enumerate(terms):
                if listed[i]:
                    c |= lists[t]
        for x, a in enumerate(p):
            for b in p[x + 1:]:
                c |= tn.sets[terms[a][0]] & tn.sets[terms[b][0]]
        if run(c, bound + pmax) or ne >= nt:
            return top, len(scored)
        if ne == 0:
            ne, cum = 1, df[0]
            continue
        target = 2 * cum
        while True:
            ne, cum = ne + 1, cum + df[ne]
            if ne >= nt or cum >= target:
                break


def simulate(args) -> int:
    with open(args.data, "rb") as f:
        d = pickle.load(f)
    tn = Tenant(d)
    lists, tails = {}, {}
    for t, (ci, g) in tn.post.items():
        if len(ci) >= args.min_df:
            lists[t] = set(ci[: args.list_length].tolist())
            tails[t] = float(g[args.list_length]) if len(g) > args.list_length else 0.0
    variants = {
        "no lists": dict(),
        "lists, N/4": dict(lists=lists, tails=tails, frac=4),
        "lists, N/8": dict(lists=lists, tails=tails, frac=8),
        "lists, N/8, pairs": dict(lists=lists, tails=tails, frac=8, zero_stage=True),
        "merged, N/8, pairs": dict(lists=lists, tails=tails, frac=8, zero_stage=True, merged=True),
        "merged, N/4, pairs": dict(lists=lists, tails=tails, frac=4, zero_stage=True, merged=True),
    }
    work = defaultdict(list)
    for rows in d["qterms"][args.skip:]:
        terms = [(t, qtf * math.log(1 + (tn.n - df + 0.5) / (df + 0.5))) for t, qtf, df in rows
                 if df > 0 and t in tn.post]
        if not terms:
            continue
        allc = set().union(*(tn.sets[t] for t, _ in terms))
        truth = tn.topk(allc, terms, args.k)
        work["exhaustive"].append(len(allc))
        for name, kw in variants.items():
            got, cost = staged(tn, terms, args.k, **kw)
            assert got == truth, (name, rows)
            work[name].append(cost)
    print(f"{args.data}: {tn.n} chunks, {len(work['exhaustive'])} queries, k = {args.k}, lists of "
          f"{args.list_length} for terms in >= {args.min_df} chunks ({len(lists)} of the query terms)")
    print(f"{'variant':20s} {'mean':>8s} {'p50':>8s} {'p90':>8s} {'p95':>8s} {'p99':>8s}   chunks scored")
    for name, v in work.items():
        v = np.array(v)
        print(f"{name:20s} {v.mean():8.0f} " + " ".join(f"{np.percentile(v, p):8.0f}" for p in (50, 90, 95, 99)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract", help="postings of one tenant of a bench database, and the bench queries")
    e.add_argument("--db", required=True)
    e.add_argument("--tenant", type=int, default=0, help="0 = largest")
    e.add_argument("--host", default="%2Fwork%2Fkb-bench%2Fpg", help="socket folder, URL-encoded")
    e.add_argument("--text-from", default="/work/shared/datasets/*/corpus.jsonl")
    e.add_argument("--queries", type=int, default=220)
    e.add_argument("--out", required=True)
    e.set_defaults(func=extract)
    s = sub.add_parser("simulate", help="chunks scored per query by each variant")
    s.add_argument("data")
    s.add_argument("--k", type=int, default=20)
    s.add_argument("--list-length", type=int, default=128)
    s.add_argument("--min-df", type=int, default=1000)
    s.add_argument("--skip", type=int, default=20, help="leading queries to skip (the benchmark's warm-up)")
    s.set_defaults(func=simulate)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
