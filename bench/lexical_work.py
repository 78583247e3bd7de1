"""Work done by kb.search_lexical per query, on two tenants of a database loaded by
bench/search_bench.py (issue 16 item 2: why the 341k-chunk tenant's lexical p95 is 2.5-2.8x
the 34k-chunk tenant's).

For each of search_bench's queries (tenant_queries: same generator and seed per tenant index;
the 20 warm-up queries skipped, as bench/lexical_ab.py does) on each tenant:
  * counters, from an instrumented copy of the working tree's
    sql/functions/10_search_lexical.sql installed as kbwork.search_lexical (scratch schema
    kbwork, dropped at the end; the installed kb.search_lexical is never changed): per term
    its tenant df, stemmed or exact, levels it has / read, chunks listed in the levels read,
    whether its postings were read through the GIN index; per round the chunk ids read from
    levels (new ones), the chunks scored, the GIN tsquery; how the search ended (threshold:
    the k-th score beat the unread bounds; finish: the last round through the GIN index).
    The copy's rows are checked against kb.search_lexical's (chunk ids, scores to 7 places).
  * buffers (shared hit + read, everything the call touched, planning of its inner
    statements included) and execution time of the installed kb.search_lexical, from
    EXPLAIN (ANALYZE, BUFFERS) of `select * from kb.search_lexical(q, k)`, the second of two
    runs; and the best of 3 plain calls (ms; noisy on a shared machine).
With --cross, each tenant also runs the other tenant's query set, so that the size effect
can be told from the query sets' (search_bench draws each tenant's queries with its own seed).
--variant NAME installs a prototype variant of the search (see VARIANTS) next to the baseline
copy and records its counters too (same rows checked).

    # (defaults: --host %2Ftmp%2Fkb-bench-1m%2Fpg --db kb_bench_1000000_10 --tenants 0,9)
    PYTHONPATH=src python bench/lexical_work.py --cross --variant finish-1x --variant finish-half \\
        --ideal 10 --out bench/results/lexical-work-1m-2026-12-01
    PYTHONPATH=src python bench/lexical_work.py --report bench/results/lexical-work-1m-2026-12-01  # .md only
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "kb_rerank" / "sql" / "functions" / "10_search_lexical.sql"
SIG = "(text, integer, double precision, double precision)"


def _sub(sql: str, old: str, new: str, count: int = 1) -> str:
    n = sql.count(old)
    if n != count:
        raise SystemExit(f"instrumentation anchor found {n} times, expected {count}: {old[:80]!r}")
    return sql.replace(old, new)


def instrumented(sql: str, name: str, variant: str | None = None) -> str:
    """The search function's SQL with counters, as kbwork.<name>: it raises one NOTICE
    'kbwork {json}' before returning."""
    sql = sql.replace("kb.search_lexical(", f"kbwork.{name}(").replace("search_lexical.", f"{name}.")
    sql = re.sub(r"^alter function .*?;\n|^comment on function .*?;\n", "", sql, flags=re.M | re.S)
    sql = _sub(sql, "  v_score text;\nbegin\n",
               "  v_score text;\n  w_rounds jsonb := '[]';\n  w_prev integer;\n  w_scored bigint;\n"
               "  w_fromids bigint;\n  w_stop text;\n  w_nids integer;\nbegin\n")
    # chunks scored per round (the previous top k, unioned in, not counted), those from level ids
    sql = _sub(sql, "               min(score)\n        from top\n",
               "               min(score),\n"
               "               (select count(*) from scored) - coalesce(cardinality($14), 0),\n"
               "               (select count(*) from scored where scored.chunk_id = any ($12))"
               " - (select count(*) from unnest($14::uuid[]) as p(id) where p.id = any ($12))\n"
               "        from top\n")
    sql = _sub(sql, "      into r_chunk, r_doc, r_score, v_min\n",
               "      into r_chunk, r_doc, r_score, v_min, w_scored, w_fromids\n")
    sql = _sub(sql, "    if v_gin_q is not null or cardinality(v_ids) > 0 then\n",
               "    w_scored := 0; w_fromids := 0; w_nids := cardinality(v_ids);\n"
               "    if v_gin_q is not null or cardinality(v_ids) > 0 then\n")
    sql = _sub(sql, "    v_seen := v_seen || v_ids;\n",
               "    w_rounds := w_rounds || jsonb_build_object('ids', w_nids, 'scored', w_scored,"
               " 'from_ids', w_fromids, 'gin', v_gin_q::text, 'last', v_last);\n"
               "    v_seen := v_seen || v_ids;\n")
    sql = _sub(sql, "    exit when v_last;\n",
               "    if v_last then w_stop := 'finish'; end if;\n    exit when v_last;\n")
    sql = _sub(sql, "    exit when v_sum = 0\n",
               "    if v_sum = 0 or (coalesce(cardinality(r_chunk), 0) = v_k and v_min > v_sum + 1e-8) then\n"
               "      w_stop := case when v_sum = 0 then 'all-read' else 'threshold' end;\n    end if;\n"
               "    exit when v_sum = 0\n")
    sql = _sub(sql, "  return query\n",
               "  raise notice 'kbwork %', jsonb_build_object('terms', to_jsonb(v_terms), 'df', to_jsonb(v_df),"
               " 'w', to_jsonb(v_w), 'nlev', to_jsonb(v_nlev), 'read', to_jsonb(v_read), 'readn', to_jsonb(v_readn),"
               " 'gin', to_jsonb(v_gin), 'rounds', w_rounds, 'stop', w_stop, 'kth', v_min, 'ln', to_jsonb(v_ln),"
               " 'off', to_jsonb(v_off))::text;\n"
               "  return query\n")
    if variant:
        for old, new in VARIANTS[variant]:
            sql = _sub(sql, old, new)
    return sql


# Prototype variants of the search (exactness-preserving), as substitutions in the
# instrumented copy.
VARIANTS: dict[str, list[tuple[str, str]]] = {
    # finish through the GIN index only when its estimated chunks are at most the next step's
    # (shipped: at most twice): the estimate assumes independent terms, and common terms
    # co-occur more (body & shape on the 341k tenant: 5,912 estimated, 9,958 scored)
    "finish-1x": [("v_step > 0 and v_finish > 2 * v_step", "v_step > 0 and v_finish > v_step")],
    # and at most half of it
    "finish-half": [("v_step > 0 and v_finish > 2 * v_step", "v_step > 0 and 2 * v_finish > v_step")],
}


def pct(a, p):
    return float(np.percentile(np.asarray(a, dtype=float), p)) if len(a) else float("nan")


def summarise(rec: dict) -> dict:
    """Per-query work from the NOTICE's JSON."""
    terms, df, nlev, read, readn, gin = (rec[x] for x in ("terms", "df", "nlev", "read", "readn", "gin"))
    rounds = rec["rounds"]
    nt = len(terms) if terms else 0
    out = {
        "n_terms": nt,
        "n_stemmed": sum(t.startswith("~ ") for t in terms or []),
        "min_df": min(df) if nt else 0,
        "max_df": max(df) if nt else 0,
        "terms_with_levels": sum(1 for x in nlev or [] if x > 0),
        "levels_read": sum(read or []),
        "max_level_read": max(read or [0]) - 1,
        "level_postings": sum(readn or []),  # chunk ids listed in the levels read (with repeats)
        "level_ids_new": sum(r["ids"] for r in rounds),  # distinct ids read from levels
        "scored": sum(r["scored"] for r in rounds),  # chunks scored exactly
        "scored_gin": sum(r["scored"] - r["from_ids"] for r in rounds),
        "rounds": len(rounds),
        "gin_terms": sum(1 for g in gin or [] if g),
        "gin_df": sum(d for d, g in zip(df or [], gin or []) if g),  # tenant postings of GIN-read terms
        "finish_gin": rounds[-1]["gin"] if rounds and rounds[-1]["last"] else None,
        "stop": rec["stop"],
    }
    return out


def ideal(conn, rows, tenant_id, n_queries) -> list[dict]:
    """The postings an exact threshold algorithm with per-posting bounds would read (no 4x
    levels, no GIN finish): for the n_queries queries of most chunks scored, every term with
    blocks read in exact tf_part order, always the term of largest current bound next, until
    the sum of the bounds is below the final k-th score (known from the run). Terms without
    blocks are read through the GIN index in round 0 (bound 0), as in the search."""
    cache: dict = {}

    def tfps(term, limit):
        if term in cache and len(cache[term]) >= limit:
            return cache[term]
        stem = term.startswith("~ ")
        a = conn.execute(f"""
          select array_agg(w order by w desc) from (
            select kb.bm25_tf_part(coalesce(array_length(u.positions, 1), 1), {'c.stem_len' if stem else 'c.doc_len'},
                                   1.2, 0.75, (select {'cs.stem_total_len' if stem else 'cs.total_len'}::float8 / cs.n_chunks
                                               from kb.corpus_stats cs where cs.tenant_id = %(t)s)) as w
            from kb.chunks c cross join lateral unnest(c.tsv) as u
            where c.tenant_id = %(t)s and c.tsv @@ kb.terms_tsquery(array[%(term)s]) and u.lexeme = %(term)s
            order by 1 desc limit %(lim)s) as x""", {"t": tenant_id, "term": term, "lim": limit}).fetchone()[0]
        cache[term] = np.array(a or [])
        return cache[term]

    out = []
    for r in sorted((r for r in rows if r.get("raw") and r["raw"]["kth"] is not None),
                    key=lambda r: -r["work_base"]["scored"])[:n_queries]:
        raw = r["raw"]
        lv = [i for i, n in enumerate(raw["nlev"]) if n > 0]
        lists = {i: tfps(raw["terms"][i], max(4 * raw["readn"][i], 8192)) for i in lv}
        pos = {i: 0 for i in lv}

        def bound(i):
            li = lists[i]
            if pos[i] < len(li):
                return raw["w"][i] * li[pos[i]]
            # past the fetched prefix: 0 when it was the whole list, else its last value
            return raw["w"][i] * li[-1] if len(li) < raw["df"][i] and len(li) else 0.0

        n = 0
        capped = False
        while lv and sum(bound(i) for i in lv) >= raw["kth"] - 1e-8:
            j = max(lv, key=bound)
            if pos[j] >= len(lists[j]):
                capped = True  # a lower bound: the fetched prefix did not suffice
                break
            pos[j] += 1
            n += 1
        out.append({"tenant": r["tenant"], "query": r["query"], "scored": r["work_base"]["scored"],
                    "level_ids": r["work_base"]["level_ids_new"], "stop": r["work_base"]["stop"],
                    "ideal_postings": n, "capped": capped,
                    "per_term": {raw["terms"][i]: [raw["df"][i], pos[i], raw["readn"][i]] for i in lv}})
    return out


def explain(conn, q: str, k: int) -> tuple[int, int, float]:
    plan = None
    for _ in range(2):
        plan = conn.execute("explain (analyze, buffers, format json) select * from kb.search_lexical(%s, %s)",
                            [q, k]).fetchone()[0][0]
    p = plan["Plan"]
    hit = p.get("Shared Hit Blocks", 0) + sum(plan.get("Planning", {}).get(x, 0) for x in ("Shared Hit Blocks",))
    read = p.get("Shared Read Blocks", 0) + plan.get("Planning", {}).get("Shared Read Blocks", 0)
    return hit, read, plan["Execution Time"]


def run(conn, tenant, n_chunks, label, queries, args, fns) -> list[dict]:
    conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
    notes: list[str] = []
    conn.add_notice_handler(lambda d: notes.append(d.message_primary))
    out = []
    for qi, (q, _) in enumerate(queries):
        ref = conn.execute("select chunk_id, round(score::numeric, 7) from kb.search_lexical(%s, %s)",
                           [q, args.k]).fetchall()
        row = {"tenant": label, "tenant_chunks": n_chunks, "qi": qi, "query": q}
        for fn in fns:
            notes.clear()
            got = conn.execute(f"select chunk_id, round(score::numeric, 7) from kbwork.{fn}(%s, %s)",
                               [q, args.k]).fetchall()
            if got != ref:
                raise SystemExit(f"kbwork.{fn} differs from kb.search_lexical on {q!r} (tenant {label})")
            msgs = [m for m in notes if m.startswith("kbwork ")]
            if not msgs:  # no term in the tenant: the function returned before the counters
                work = {"n_terms": 0, "scored": 0, "rounds": 0, "level_ids_new": 0, "level_postings": 0,
                        "levels_read": 0, "stop": "no-terms"}
                raw = None
            else:
                raw = json.loads(msgs[-1][len("kbwork "):])
                work = summarise(raw)
            row[fn] = work
            if fn == "work_base":
                row["raw"] = raw
        if args.explain:
            row["buf_hit"], row["buf_read"], row["explain_ms"] = explain(conn, q, args.k)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            conn.execute("select chunk_id from kb.search_lexical(%s, %s)", [q, args.k]).fetchall()
            best = min(best, (time.perf_counter() - t0) * 1000)
        row["ms"] = best
        out.append(row)
    conn._notice_handlers.clear()
    return out


def fit(rows, y, xs):
    """Least squares y ~ a + sum(b_x * x); returns the coefficients and R^2."""
    X = np.array([[1.0] + [float(r["work_base"].get(x, 0)) for x in xs] for r in rows])
    Y = np.array([float(r[y]) for r in rows])
    c, *_ = np.linalg.lstsq(X, Y, rcond=None)
    r2 = 1 - ((Y - X @ c) ** 2).sum() / ((Y - Y.mean()) ** 2).sum()
    return c, r2


def report(res: dict) -> str:
    rows = res["rows"]
    tis = sorted({r["tenant_index"] for r in rows})
    sets = sorted({(r["tenant_index"], r["query_set"]) for r in rows}, key=lambda x: (x[1], x[0]))
    n = {int(k): v["chunks"] for k, v in res["tenants"].items()}

    def sel(ti, qs):
        return [r for r in rows if r["tenant_index"] == ti and r["query_set"] == qs]

    def val(r, k, fn="work_base"):
        return r[k] if k in r else r[fn].get(k, 0)

    a = res["args"]
    out = [f"# kb.search_lexical: work per query, {res['db']} (tenants {', '.join(f'{t} = {n[t]} chunks' for t in tis)})", "",
           f"k = {a['k']}; {a['queries']} queries per set (search_bench's tenant_queries, {a['warmup']} warm-up skipped); "
           f"installed kb.search_lexical identical to the working tree's: {res['installed_matches_worktree']}. "
           "Counters from an instrumented copy (kbwork schema, dropped after; its rows checked equal to the installed "
           "function's on every query). Buffers and EXPLAIN ms: EXPLAIN (ANALYZE, BUFFERS) of the installed function, "
           f"second run; ms: best of {a['repeat']} plain calls, on a shared 2-core machine (noisy: read the counts).", "",
           "    " + res.get("command", ""), ""]
    keys = [("ms", "ms (best of 3)"), ("explain_ms", "EXPLAIN ms"), ("buf_hit", "buffers hit"), ("buf_read", "buffers read"),
            ("scored", "chunks scored"), ("scored_gin", "  of them through GIN"), ("level_ids_new", "ids read from levels"),
            ("levels_read", "levels read (all terms)"), ("rounds", "rounds"), ("n_terms", "terms")]
    for qs in sorted({s[1] for s in sets}):
        tt = [ti for ti, q in sets if q == qs]
        out += [f"## Queries of tenant {qs} (search_bench's set for the {'largest' if qs == 0 else 'small'} tenant)", "",
                "| measure | " + " | ".join(f"t{ti} p50 | t{ti} p95" for ti in tt) +
                (f" | p50 ratio t{tt[0]}/t{tt[-1]} | p95 ratio" if len(tt) == 2 else "") + " |",
                "|---|" + "---:|" * (2 * len(tt) + (2 if len(tt) == 2 else 0))]
        for k, label in keys:
            cells, ps = [], []
            for ti in tt:
                v = [val(r, k) for r in sel(ti, qs)]
                ps.append((pct(v, 50), pct(v, 95)))
                cells += [f"{ps[-1][0]:.1f}", f"{ps[-1][1]:.1f}"]
            if len(tt) == 2:
                cells += [f"{ps[0][0] / ps[1][0]:.2f}" if ps[1][0] else "", f"{ps[0][1] / ps[1][1]:.2f}" if ps[1][1] else ""]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        if len(tt) == 2:
            a_, b_ = sel(tt[0], qs), sel(tt[1], qs)
            rat = {k: [val(x, k) / val(y, k) for x, y in zip(a_, b_) if val(y, k)] for k in ("scored", "buf_hit", "explain_ms")}
            out.append(f"| per-query ratio t{tt[0]}/t{tt[1]}, same query (p50 / p95 of the ratios) | "
                       + " | ".join(f"{k} {pct(v, 50):.2f} / {pct(v, 95):.2f}" for k, v in rat.items()) + " |" + " |" * 2)
        out.append("")
        out.append("How the searches ended (threshold: k-th score above the unread bounds; finish: last round through "
                   "the GIN index; all-read: every term read through the GIN index in round 0):")
        out.append("")
        for ti in tt:
            c: dict = {}
            for r in sel(ti, qs):
                c[r["work_base"]["stop"]] = c.get(r["work_base"]["stop"], 0) + 1
            out.append(f"* t{ti}: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
        out.append("")
    # shapes of the slow queries
    out += ["## The top 5% (by buffers) of each tenant's own queries", "",
            "| tenant | query | terms: df/N (levels read / levels; G = all postings through GIN) | stop | scored | GIN | level ids | rounds | buffers | ms |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for ti in tis:
        own = sorted(sel(ti, ti), key=lambda r: -r.get("buf_hit", r["work_base"]["scored"]))
        for r in own[: max(1, len(own) // 20)]:
            raw, w = r["raw"], r["work_base"]
            terms = " ".join(f"`{t}` {df / n[ti]:.3f} ({rd}/{nl}{' G' if g else ''})" for t, df, nl, rd, g in
                             zip(raw["terms"], raw["df"], raw["nlev"], raw["read"], raw["gin"]))
            out.append(f"| t{ti} | {r['query']} | {terms} | {w['stop']} | {w['scored']} | {w['scored_gin']} | "
                       f"{w['level_ids_new']} | {w['rounds']} | {r.get('buf_hit', '')} | {r['ms']:.1f} |")
    out.append("")
    # shape classes
    out += ["## Query shapes (own query sets): chunks scored by class", "",
            "Classes by the smallest df among the query's terms, as a fraction of the tenant's chunks "
            "(a query whose rarest term is common can only stop late), and whether every term has blocks.", "",
            "| tenant | class | queries | scored p50 | scored p95 | buffers p95 | rounds mean | ms p95 |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for ti in tis:
        own = [r for r in sel(ti, ti) if r["raw"]]
        classes = {"rarest df < 1%": lambda r: min(r["raw"]["df"]) / n[ti] < 0.01,
                   "rarest df 1-5%": lambda r: 0.01 <= min(r["raw"]["df"]) / n[ti] < 0.05,
                   "rarest df >= 5%": lambda r: min(r["raw"]["df"]) / n[ti] >= 0.05,
                   "2 terms, both >= 5%": lambda r: len(r["raw"]["df"]) == 2 and min(r["raw"]["df"]) / n[ti] >= 0.05,
                   "a term without blocks (GIN in round 0)": lambda r: min(r["raw"]["nlev"]) == 0,
                   "all terms stemmed": lambda r: all(t.startswith("~ ") for t in r["raw"]["terms"]),
                   "no stemmed term (Vietnamese)": lambda r: not any(t.startswith("~ ") for t in r["raw"]["terms"])}
        for name, f in classes.items():
            rs = [r for r in own if f(r)]
            if not rs:
                continue
            sc = [r["work_base"]["scored"] for r in rs]
            out.append(f"| t{ti} | {name} | {len(rs)} | {pct(sc, 50):.0f} | {pct(sc, 95):.0f} | "
                       f"{pct([r.get('buf_hit', 0) for r in rs], 95):.0f} | "
                       f"{np.mean([r['work_base']['rounds'] for r in rs]):.2f} | {pct([r['ms'] for r in rs], 95):.1f} |")
    out.append("")
    # cost model
    out += ["## Time and buffers against work (own query sets, least squares)", "",
            "| tenant | y | intercept | per chunk scored | per level id | per round | R^2 |", "|---|---|---:|---:|---:|---:|---:|"]
    for ti in tis:
        own = [r for r in sel(ti, ti) if r["raw"]]
        for y in ("ms", "explain_ms", "buf_hit"):
            if y not in own[0]:
                continue
            c, r2 = fit(own, y, ["scored", "level_ids_new", "rounds"])
            out.append(f"| t{ti} | {y} | {c[0]:.2f} | {c[1]:.4f} | {c[2]:.4f} | {c[3]:.2f} | {r2:.2f} |")
    out.append("")
    variants = [k for k in rows[0] if k.startswith("work_") and k != "work_base"]
    if variants:
        out += ["## Prototype variants (counters; same rows as the installed function on every query)", "",
                "| tenant | query set | variant | scored p50 | scored p95 | scored mean | rounds mean | queries with fewer / more scored |",
                "|---|---|---|---:|---:|---:|---:|---|"]
        for ti, qs in sets:
            rs = sel(ti, qs)
            for v in ["work_base"] + variants:
                sc = [r[v]["scored"] for r in rs]
                fewer = sum(r[v]["scored"] < r["work_base"]["scored"] for r in rs)
                more = sum(r[v]["scored"] > r["work_base"]["scored"] for r in rs)
                out.append(f"| t{ti} | {qs} | {v[5:]} | {pct(sc, 50):.0f} | {pct(sc, 95):.0f} | {np.mean(sc):.0f} | "
                           f"{np.mean([r[v]['rounds'] for r in rs]):.2f} | {fewer} / {more} |")
        out.append("")
    if res.get("ideal"):
        out += ["## Ideal reads of the queries that scored most", "",
                "Postings an exact threshold algorithm with a bound per posting would read (terms with blocks read in "
                "exact tf_part order, largest bound first, until the bounds sum below the final k-th score): the "
                "depth the data demand, against the chunks the search scored (levels 4x apart, GIN finish).", "",
                "| tenant | query | scored | ideal postings | per term: df, ideal depth, listed in levels read | stop |",
                "|---|---|---:|---:|---|---|"]
        for o in res["ideal"]:
            pt = "; ".join(f"`{t}` {v[0]}, {v[1]}, {v[2]}" for t, v in o["per_term"].items())
            out.append(f"| {o['tenant']} | {o['query']} | {o['scored']} | {o['ideal_postings']}{' (capped)' if o['capped'] else ''} | {pt} | {o['stop']} |")
        out.append("")
        for ti in tis:
            os_ = [o for o in res["ideal"] if o["tenant"] == f"t{ti}"]
            if os_:
                out.append(f"* t{ti}: median scored {np.median([o['scored'] for o in os_]):.0f}, "
                           f"median ideal postings {np.median([o['ideal_postings'] for o in os_]):.0f}")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="%2Ftmp%2Fkb-bench-1m%2Fpg", help="socket folder, URL-encoded")
    ap.add_argument("--db", default="kb_bench_1000000_10")
    ap.add_argument("--tenants", default="0,9", help="tenant indexes by size, 0 = largest")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20, help="search_bench's warm-up queries, skipped")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-explain", dest="explain", action="store_false")
    ap.add_argument("--cross", action="store_true", help="also each tenant with the other tenants' query sets")
    ap.add_argument("--variant", action="append", default=[], choices=sorted(VARIANTS))
    ap.add_argument("--ideal", type=int, default=0, help="per tenant, the ideal-read analysis of this many queries")
    ap.add_argument("--text-from", default="/work/shared/datasets/*/corpus.jsonl")
    ap.add_argument("--out", help="path stem of the .json and .md results")
    ap.add_argument("--report", help="only write the .md of an existing .json (path stem)")
    args = ap.parse_args(argv)
    if args.report:
        res = json.loads(Path(args.report + ".json").read_text(encoding="utf-8"))
        Path(args.report + ".md").write_text(report(res), encoding="utf-8")
        print(f"wrote {args.report}.md", file=sys.stderr)
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    import search_bench as sb

    sents, _ = sb.load_sentences(args.text_from)
    centres = sb.make_centres()
    tis = [int(x) for x in args.tenants.split(",")]
    qsets = {ti: sb.tenant_queries(ti, sents, centres, args.warmup + args.queries)[args.warmup:] for ti in tis}
    conn = psycopg.connect(f"postgresql://postgres@/{args.db}?host={args.host}", autocommit=True)
    stats = conn.execute("select tenant_id, n_chunks from kb.corpus_stats order by n_chunks desc").fetchall()
    src = SRC.read_text(encoding="utf-8")
    body = src.split("$fn$")[1]
    installed = conn.execute("select prosrc from pg_proc where oid = %s::regprocedure",
                             [f"kb.search_lexical{SIG}"]).fetchone()[0]
    same = installed.strip() == body.strip()
    print(f"installed kb.search_lexical == working tree's: {same}", file=sys.stderr)
    conn.execute("create schema if not exists kbwork")
    conn.execute("grant usage on schema kbwork to kb_search")
    fns = {"work_base": None} | {f"work_{v.replace('-', '_')}": v for v in args.variant}
    for fn, variant in fns.items():
        conn.execute(instrumented(src, fn, variant))
        conn.execute(f"alter function kbwork.{fn}{SIG} owner to kb_search")
    rows = []
    try:
        for ti in tis:
            tenant, n = stats[ti]
            for qs in tis if args.cross else [ti]:
                t0 = time.perf_counter()
                rows += [r | {"tenant_index": ti, "query_set": qs}
                         for r in run(conn, tenant, n, f"t{ti}", qsets[qs], args, list(fns))]
                print(f"tenant {ti} ({n} chunks), queries of tenant {qs}: {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr, flush=True)
        ideals = []
        for ti in tis:
            if args.ideal:
                t0 = time.perf_counter()
                own = [r for r in rows if r["tenant_index"] == ti and r["query_set"] == ti]
                ideals += ideal(conn, own, stats[ti][0], args.ideal)
                print(f"ideal reads, tenant {ti}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        conn.execute("drop schema kbwork cascade")
    res = {"command": "python bench/lexical_work.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "ideal": ideals, "db": args.db, "args": vars(args), "installed_matches_worktree": same,
           "tenants": {ti: {"tenant_id": str(stats[ti][0]), "chunks": stats[ti][1]} for ti in tis}, "rows": rows}
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(res, separators=(",", ":"), default=str), encoding="utf-8")
        Path(args.out + ".md").write_text(report(json.loads(json.dumps(res, default=str))), encoding="utf-8")
        print(f"wrote {args.out}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
