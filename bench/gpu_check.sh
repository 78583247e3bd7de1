#!/usr/bin/env bash
# The cross-encoder on an NVIDIA GPU, in one command: bge-reranker-v2-m3 (the real checkpoint
# when it is in the local Hugging Face cache, else its architecture with random weights) in
# fp16, 40 pairs a request, p50/p95 over 50 requests through the service's Reranker, then the
# rerank budget path (KB_RERANK_BUDGET_MS, --budget-ms 300): its p95 and the share of pairs reached, as JSON.
#
#   bench/gpu_check.sh                      # from the repository root; extra arguments go to
#   bench/gpu_check.sh --workload mixed     # bench/gpu_check.py (--requests, --max-length, ...)
#
# PYTHON (default: python3) must have kb-rerank's rerank extra (torch with CUDA). Exits 2
# without a GPU; the Python part runs on a CPU for a smoke test:
#   PYTHONPATH=src python3 bench/gpu_check.py --device cpu --requests 2 --tiny
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing or sees no device); this check needs one" >&2
    exit 2
fi
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: $PYTHON's torch has no CUDA (install a CUDA build of torch: pip install 'kb-rerank[rerank]')" >&2
    exit 2
fi
nvidia-smi -L >&2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
exec "$PYTHON" bench/gpu_check.py --device cuda "$@"
