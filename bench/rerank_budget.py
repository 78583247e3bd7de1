"""Does the rerank step keep its budget (``KB_RERANK_BUDGET_MS``)? p50/p95 of the rerank time
against the budget, and the share of the candidates the model ranked, per model and budget.

Every request goes through the service's step (:func:`kb_rerank.rerank.scoring.score` over
the service's ``Reranker``, calibrated at load, ``KB_RERANK_UNIT_MS`` turns): 40 candidates a
request at ``--max-length`` tokens (``mixed`` lengths of bench/model_cost.py: 16-480 tokens),
no pair cache (every request a new query). Models: the tiny test model and the random-weight
architectures of bench/model_cost.py ``--fit`` (cost does not depend on weights). Two
patterns: ``sequential`` (one request after the other) and ``burst`` (``--burst`` requests at
once on the one model worker: they take turns batch by batch). "over budget" is how far p95
lies above the budget; the bound the service promises is one unit (``--unit-ms``) for torch.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python bench/rerank_budget.py \\
        --models tiny cross-encoder/ms-marco-MiniLM-L-6-v2 --budgets 100 300 --out bench/results/rerank-budget

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT / "src", ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

N = 40


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def build(model: str, tmp: Path) -> str:
    from kb_rerank.testing import tiny_model

    if model == "tiny":
        return str(tiny_model.build_tiny_cross_encoder(tmp / "tiny"))
    return str(tiny_model.build_random_cross_encoder(tmp / model.replace("/", "--"), model))


async def requests(r, query: str, texts: list[str], budget_ms: float, count: int, burst: int) -> list:
    from kb_rerank.rerank import scoring

    out, serial = [], 0

    async def one() -> scoring.Scored:
        nonlocal serial
        serial += 1
        keys = [(serial, i) for i in range(len(texts))]  # a new query: nothing in the pair cache
        return await scoring.score(r, query, texts, keys, budget_ms=budget_ms, timeout_s=60)

    while len(out) < count:
        out.extend(await asyncio.gather(*(one() for _ in range(burst))))
    return out[:count]


def run_model(model: str, args, tmp: Path) -> list[dict]:
    import torch

    from kb_rerank.models.cross_encoder import Reranker
    from model_cost import make_workloads

    torch.set_num_threads(args.threads)
    path = build(model, tmp)
    common = dict(max_length=args.max_length, batch_size=args.batch_size, timeout_s=0, unit_ms=args.unit_ms)
    if args.backend == "onnx":  # the int8 export the service loads (kb-rerank model export --quantize int8)
        from kb_rerank.models.onnx import OnnxReranker, export_model

        export_model(path, tmp / "onnx", quantize="int8", log=lambda *a: None)
        r = OnnxReranker(path, export_root=tmp / "onnx", quantize="int8", threads=args.threads, **common)
    else:
        r = Reranker(path, device="cpu", **common)
    t = time.perf_counter()
    r.load()
    load_s = time.perf_counter() - t
    rows = []
    try:
        query, workloads = make_workloads(r._tokenizer)
        texts = (workloads["mixed"] * 2)[:N]
        for budget in args.budgets:
            for pattern, burst in (("sequential", 1), ("burst", args.burst)):
                asyncio.run(requests(r, query, texts, budget, 1, 1))  # warm
                got = asyncio.run(requests(r, query, texts, budget, args.requests, burst))
                ms = [s.ms for s in got]
                share = [s.reranked / N for s in got]
                rows.append({
                    "model": model, "backend": args.backend, "budget_ms": budget, "pattern": pattern, "requests": len(got),
                    "p50_ms": pct(ms, 0.5), "p95_ms": pct(ms, 0.95), "max_ms": max(ms),
                    "over_budget_p95_ms": max(0, pct(ms, 0.95) - budget),
                    "reranked_share_mean": round(statistics.fmean(share), 3),
                    "reranked_share_min": round(min(share), 3),
                    "fallbacks": sum(s.reason is not None for s in got),
                    "ms_per_pair_calibrated": r.cost.snapshot()["ms_per_pair"],
                    "load_s": round(load_s, 1),
                })
                print(json.dumps(rows[-1]), flush=True)
    finally:
        r.close()
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Rerank budget adherence ({meta['run']})", "",
             f"Command: `{meta['command']}`", "",
             f"CPU: {meta['cpu']}; torch {meta['torch']}; threads {meta['threads']}; load average before "
             f"{meta['loadavg_before']}, after {meta['loadavg_after']}. 40 candidates a request (mixed lengths, "
             f"max {meta['max_length']} tokens), no pair cache, unit {meta['unit_ms']} ms.", "",
             "| model | backend | budget ms | pattern | p50 ms | p95 ms | max ms | p95 over budget ms | reranked share (mean / min) "
             "| fallbacks | calibrated ms a pair |",
             "|---|---|---:|---|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['backend']} | {r['budget_ms']:g} | {r['pattern']} | {r['p50_ms']} | {r['p95_ms']} | "
                     f"{r['max_ms']} | {r['over_budget_p95_ms']} | {r['reranked_share_mean']:.0%} / "
                     f"{r['reranked_share_min']:.0%} | {r['fallbacks']} | {r['ms_per_pair_calibrated']} |")
    lines += ["", "A fallback here is `model_budget`: not even one pair fitted in the budget (the answer is then "
              "in fused order, `fallback: true`)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny", "cross-encoder/ms-marco-MiniLM-L-6-v2"])
    p.add_argument("--budgets", nargs="+", type=float, default=[100.0, 300.0])
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--burst", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--unit-ms", type=float, default=50.0)
    p.add_argument("--backend", choices=["torch", "onnx"], default="torch", help="onnx: the int8 export")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rerank-budget")
    args = p.parse_args(argv)
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    meta = {"run": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu, "torch": torch.__version__,
            "threads": args.threads, "max_length": args.max_length, "unit_ms": args.unit_ms,
            "loadavg_before": round(os.getloadavg()[0], 2),
            "command": "python bench/rerank_budget.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kb-budget-") as tmp:
        for model in args.models:
            rows.extend(run_model(model, args, Path(tmp)))
    meta["loadavg_after"] = round(os.getloadavg()[0], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
