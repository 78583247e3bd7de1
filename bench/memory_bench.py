"""Resident memory of the API server process, with and without a cross-encoder loaded.

Starts `kb-rerank serve` (one worker) on a loopback port against the configured database
(the embedded one by default: run `make demo` first), sends a few requests, and reads the
process's RSS with psutil. Configurations, measured in the same run:
  * no model: KB_RERANKER_MODEL points at a missing folder (the load fails, the service
    answers with the fused order);
  * tiny model: the offline tiny cross-encoder (kb_rerank.testing.tiny_model);
  * --model PATH: any model folder (e.g. one with bge-reranker-v2-m3's architecture).

    python bench/memory_bench.py [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from kb_rerank.http.auth import JwtConfig, mint_token
from kb_rerank.core.dev import DEMO_TENANT
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

SECRET = "kb-rerank-bench-secret-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(model: str, requests: int = 20) -> dict:
    port = free_port()
    env = {**os.environ, "KB_JWT_SECRET": SECRET, "KB_RERANKER_MODEL": model, "HF_HUB_OFFLINE": "1",
           "KB_RATE_LIMIT_PER_MINUTE": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "kb_rerank.cli.main", "serve", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        state = None
        for _ in range(240):
            try:
                with urllib.request.urlopen(base + "/readyz", timeout=2) as r:
                    state = json.loads(r.read())["model"]["state"]
                if state not in ("loading", "not_loaded"):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        rss_idle = psutil.Process(proc.pid).memory_info().rss
        token = mint_token(DEMO_TENANT, JwtConfig(secret=SECRET))
        for i in range(requests):
            body = json.dumps({"query": f"how do I export invoices {i}", "source": "hybrid_lexical_semantic"})
            req = urllib.request.Request(base + "/v1/kb/search/rerank", data=body.encode(), method="POST",
                                         headers={"Authorization": "Bearer " + token,
                                                  "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                r.read()
        rss = psutil.Process(proc.pid).memory_info().rss
        return {"model": model, "model_state": state, "rss_idle_mb": rss_idle / 2**20,
                "rss_after_requests_mb": rss / 2**20, "requests": requests}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[])
    args = p.parse_args()
    tiny = build_tiny_cross_encoder(Path(tempfile.mkdtemp()) / "tiny")
    rows = [measure("/nonexistent/model"), measure(str(tiny))] + [measure(m) for m in args.model]
    print("| configuration | model state | RSS idle MB | RSS after requests MB |")
    print("|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['model_state']} | {r['rss_idle_mb']:.0f} | {r['rss_after_requests_mb']:.0f} |")
    out = Path("bench/results/memory.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
