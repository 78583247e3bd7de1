"""Latency of the service's cross-encoder on a GPU: p50/p95 over ``--requests`` requests of
``--pairs`` (query, passage) pairs, printed as JSON (``bench/gpu_check.sh`` runs it).

Every request goes through ``kb_rerank.models.cross_encoder.Reranker.score`` (the code the
service runs: FlagEmbedding tokenisation, length-sorted batches, sigmoid), on ``--device``
(default ``cuda``; fp16 on CUDA, as the service does). The model is
``BAAI/bge-reranker-v2-m3`` when it is in the local Hugging Face cache, else (or with
``--random``) a randomly initialised model with its architecture (the cost of a forward pass
does not depend on the weights). Then the budget path: the service's rerank step
(:func:`kb_rerank.rerank.scoring.score`) within ``--budget-ms`` (300), its p50/p95 and the
share of the pairs the model reached. ``--tiny``: the tiny test model, for a CPU smoke run::

    PYTHONPATH=src python bench/gpu_check.py --device cpu --requests 2 --tiny
"""

from __future__ import annotations

import argparse
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

REAL = "BAAI/bge-reranker-v2-m3"


def cached_real_model() -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(REAL, "config.json"), str)
    except Exception:  # noqa: BLE001 - no hub library or no cache: build the random one
        return False


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def run(args) -> dict:
    import torch

    from kb_rerank.models.cross_encoder import Reranker
    from kb_rerank.testing.tiny_model import build_random_bge_reranker_v2_m3, build_tiny_cross_encoder
    from model_cost import make_workloads

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"gpu_check: --device {args.device} but torch sees no CUDA GPU "
                         f"(torch {torch.__version__}, cuda build {torch.version.cuda})")
    with tempfile.TemporaryDirectory(prefix="kb-gpu-check-") as tmp:
        if args.tiny:
            model, label = str(build_tiny_cross_encoder(Path(tmp) / "tiny")), "tiny random test model"
        elif cached_real_model() and not args.random:
            model, label = REAL, REAL
        else:
            model = str(build_random_bge_reranker_v2_m3(Path(tmp) / "bge-v2-m3-random"))
            label = "random bge-reranker-v2-m3 architecture"
        r = Reranker(model, device=args.device, max_length=args.max_length, batch_size=args.batch_size,
                     timeout_s=0)
        r.load()
        try:
            query, workloads = make_workloads(r._tokenizer)
            passages = (workloads[args.workload] * (args.pairs // len(workloads[args.workload]) + 1))[:args.pairs]
            lengths = [len(e["input_ids"]) for e in r._encode(query, passages)]
            for _ in range(args.warmup):
                r.score(query, passages)
            times = []
            for _ in range(args.requests):
                t0 = time.perf_counter()
                scores = r.score(query, passages)
                times.append((time.perf_counter() - t0) * 1000)
                assert len(scores) == len(passages) and all(0.0 <= s <= 1.0 for s in scores)
            budget = budget_path(r, query, passages, args) if args.budget_ms > 0 else None
        finally:
            r.close()
    return {
        "model": label, "device": r.device, "fp16": r.fp16,
        "gpu": torch.cuda.get_device_name(0) if r.device and r.device.startswith("cuda") else None,
        "torch": torch.__version__, "python": platform.python_version(),
        "pairs": len(passages), "workload": args.workload, "tokens_per_pair_mean": round(statistics.fmean(lengths), 1),
        "max_length": args.max_length, "batch_size": args.batch_size, "warmup": args.warmup,
        "requests": args.requests, "p50_ms": round(percentile(times, 0.5), 1),
        "p95_ms": round(percentile(times, 0.95), 1), "mean_ms": round(statistics.fmean(times), 1),
        "max_ms": round(max(times), 1), "load_s": round(r.load_seconds or 0, 1),
        "forward_cost": r.cost.snapshot(), "budget": budget,
        "run": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def budget_path(r, query: str, passages: list[str], args) -> dict:
    """The service's rerank step within ``--budget-ms`` (KB_RERANK_BUDGET_MS): rerank time and
    the share of the pairs the model reached, over ``--requests`` requests (no pair cache)."""
    import asyncio

    from kb_rerank.rerank import scoring

    got = []
    for i in range(args.requests):
        keys = [(i, j) for j in range(len(passages))]
        got.append(asyncio.run(scoring.score(r, query, passages, keys, budget_ms=args.budget_ms, timeout_s=60)))
    ms = [s.ms for s in got]
    return {"budget_ms": args.budget_ms, "p50_ms": percentile(ms, 0.5), "p95_ms": percentile(ms, 0.95),
            "reranked_share_mean": round(statistics.fmean(s.reranked / len(passages) for s in got), 3),
            "partial": sum(s.partial is not None for s in got), "fallbacks": sum(s.reason is not None for s in got)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=40, help="one forward pass for 40 pairs on a GPU")
    p.add_argument("--workload", choices=["uniform", "mixed"], default="uniform",
                   help="uniform: ~256 tokens a pair; mixed: 16-480")
    p.add_argument("--random", action="store_true", help="random weights even if the real model is cached")
    p.add_argument("--tiny", action="store_true", help="the tiny test model (CPU smoke run)")
    p.add_argument("--budget-ms", type=float, default=300.0,
                   help="then the budget path (KB_RERANK_BUDGET_MS) over as many requests; 0 skips it")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
