"""bench/gpu_check.sh: refuses clearly without a GPU; its Python part measures the
service's Reranker and prints p50/p95 JSON (smoke run on the CPU with the tiny model)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("nvidia_smi", ["missing", "sees no device"])
def test_the_shell_script_fails_clearly_without_a_gpu(tmp_path, nvidia_smi):
    # the machine's own nvidia-smi (if any) is shadowed, so this runs the same on a GPU host
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "python3"):  # what the script needs besides bash builtins
        (bin_dir / tool).symlink_to(shutil.which(tool) or sys.executable)
    if nvidia_smi == "sees no device":
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    r = subprocess.run([shutil.which("bash"), str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True,
                       timeout=60, env={"PATH": str(bin_dir)})
    assert r.returncode == 2 and "no NVIDIA GPU" in r.stderr and r.stdout == ""


def test_the_python_part_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny",
                        "--requests", "2", "--warmup", "1", "--pairs", "8", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT / "src"),
                                                                          "PATH": "/usr/bin:/bin",
                                                                          "OPENBLAS_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["fp16"] is False and result["requests"] == 2
    assert result["pairs"] == 8 and 0 < result["p50_ms"] <= result["p95_ms"] <= result["max_ms"]
    budget = result["budget"]  # the budget path: the tiny model scores all 8 pairs well within 300 ms
    assert budget["budget_ms"] == 300 and budget["reranked_share_mean"] == 1.0 and budget["fallbacks"] == 0
    assert result["forward_cost"]["calibrated"] is True


def test_cuda_without_a_gpu_is_refused():
    # CUDA_VISIBLE_DEVICES="" hides any GPU from torch, so this runs the same on a GPU host
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--tiny", "--requests", "1"],
                       capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT / "src"),
                                                                          "PATH": "/usr/bin:/bin",
                                                                          "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode != 0 and "no CUDA GPU" in r.stderr
