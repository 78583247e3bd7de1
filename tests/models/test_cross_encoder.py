"""Cross-encoder layer (kb_rerank.models.cross_encoder) on a tiny random offline model. No database."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import asyncio
import hashlib
import math
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kb_rerank.models.cross_encoder import Reranker, RerankerError, RerankerTimeout, RerankerUnavailable, plan_batches
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder, sample_words

QUERY = "how do i reset my password"
PASSAGES = [
    "reset your password from the login page",
    "hóa đơn thanh toán của khách hàng",
    "the river is long and the water is cold",
    "xyzzy",
    "water " * 40,
    "",
    "Bạn có thể đặt lại mật khẩu trong phần cài đặt tài khoản.",
    "customer support ticket about a refund policy " * 6,
    "password reset",
    "đăng nhập lỗi hệ thống máy chủ",
]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-ce") / "model", seed=0)


def _loaded(path: Path, **kw) -> Reranker:
    r = Reranker(str(path), device="cpu", **kw)
    r.load()
    return r


@pytest.fixture(scope="session")
def reranker(tiny_model_dir):
    r = _loaded(tiny_model_dir, batch_size=4)
    yield r
    r.close()


def _close(a, b, tol=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


# ---------------------------------------------------------------- model builder
def test_import_is_cheap():
    code = "import sys, kb_rerank.models.cross_encoder, kb_rerank.testing.tiny_model; assert 'torch' not in sys.modules; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_tiny_model_loads_with_auto_classes_and_flagreranker(tiny_model_dir, reranker):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)
    assert model.config.num_labels == 1
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    toks = tok.convert_ids_to_tokens(tok("xin chào", "reset password")["input_ids"])
    assert toks == ["<s>", "xin", "chào", "</s>", "</s>", "reset", "password", "</s>"]
    # FlagReranker(str(path)) loads it too (the Reranker goes through it).
    assert type(reranker.flag_reranker).__name__ == "BaseReranker"
    assert all(len(tok(w, add_special_tokens=False)["input_ids"]) == 1 for w in sample_words()[:200])


def test_tiny_model_is_deterministic_per_seed(tmp_path, tiny_model_dir):
    def digest(p: Path) -> str:
        return hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()

    again = build_tiny_cross_encoder(tmp_path / "again", seed=0)
    other = build_tiny_cross_encoder(tmp_path / "other", seed=1)
    assert digest(again) == digest(tiny_model_dir)
    assert digest(other) != digest(tiny_model_dir)
    assert (again / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()


# ---------------------------------------------------------------- scoring
def test_scores_shape_range_and_state(reranker):
    assert reranker.state == "ready" and reranker.last_error is None
    assert reranker.model_name.endswith("model")
    scores = reranker.score(QUERY, PASSAGES)
    assert len(scores) == len(PASSAGES)
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores)
    assert len({round(s, 6) for s in scores}) > len(PASSAGES) // 2  # not all the same


def test_input_order_is_preserved(reranker):
    base = reranker.score(QUERY, PASSAGES)
    rng = random.Random(7)
    for _ in range(3):
        perm = list(range(len(PASSAGES)))
        rng.shuffle(perm)
        permuted = reranker.score(QUERY, [PASSAGES[i] for i in perm])
        assert _close(permuted, [base[i] for i in perm])


def test_deterministic_across_calls(reranker):
    assert reranker.score(QUERY, PASSAGES) == reranker.score(QUERY, PASSAGES)


def test_batch_size_does_not_change_scores(tiny_model_dir):
    small, big = _loaded(tiny_model_dir, batch_size=2), _loaded(tiny_model_dir, batch_size=64)
    try:
        b0 = small.batches
        s_small = small.score(QUERY, PASSAGES)
        assert small.batches - b0 == math.ceil(len(PASSAGES) / 2)
        s_big = big.score(QUERY, PASSAGES)
        assert _close(s_small, s_big)
    finally:
        small.close()
        big.close()


def test_matches_flagreranker_compute_score(tiny_model_dir):
    # Same tokenization/truncation as FlagReranker, incl. truncation at max_length.
    r = _loaded(tiny_model_dir, batch_size=3, max_length=32)
    try:
        long_passages = PASSAGES + [" ".join(sample_words()[i : i + 120]) for i in (0, 50, 300)]
        ours = r.score(QUERY, long_passages)
        theirs = r.flag_reranker.compute_score([(QUERY, p) for p in long_passages], normalize=True)
        assert _close(ours, theirs)
        assert max(len(e["input_ids"]) for e in r._encode(QUERY, long_passages)) == 32
        # Truncated: text past max_length does not change the score.
        assert _close(r.score(QUERY, [long_passages[-1]]), r.score(QUERY, [long_passages[-1] + " extra tail words"]))
    finally:
        r.close()


def test_plan_batches_sorts_by_length_and_covers_all():
    lengths = [5, 50, 7, 49, 3]
    assert plan_batches(lengths, 2) == [[1, 3], [2, 0], [4]]
    assert plan_batches(lengths, 2, sort_by_length=False) == [[0, 1], [2, 3], [4]]
    assert plan_batches([], 4) == []


def test_empty_passages_do_not_reach_model(reranker):
    calls, pairs = reranker.calls, reranker.pairs_scored
    assert reranker.score(QUERY, []) == []
    assert asyncio.run(reranker.ascore(QUERY, [])) == []
    assert (reranker.calls, reranker.pairs_scored) == (calls, pairs)
    reranker.score(QUERY, PASSAGES[:3])
    assert (reranker.calls, reranker.pairs_scored) == (calls + 1, pairs + 3)


# ---------------------------------------------------------------- async
def test_ascore_runs_off_the_event_loop(reranker, monkeypatch):
    import torch

    expected = reranker.score(QUERY, PASSAGES)
    real = reranker._compute_logits
    seen_threads = []

    started, loop_ran, waited = threading.Event(), threading.Event(), []

    def slow(query, passages):
        seen_threads.append(threading.current_thread().name)
        started.set()
        # the event loop must run while this waits: on the loop it would wait the 10 s out
        waited.append(loop_ran.wait(10.0))
        return real(query, passages)

    monkeypatch.setattr(reranker, "_compute_logits", slow)

    async def main():
        async def ticker():
            while not started.is_set():
                await asyncio.sleep(0.001)
            loop_ran.set()

        task = asyncio.create_task(ticker())
        scores = await reranker.ascore(QUERY, PASSAGES, timeout_s=30)
        await task
        return scores

    scores = asyncio.run(main())
    assert _close(scores, expected)
    assert waited == [True]
    assert seen_threads and seen_threads[0].startswith("kb-rerank")
    # torch's intra-op thread setting is the same on the worker thread.
    assert reranker._executor.submit(torch.get_num_threads).result() == torch.get_num_threads()


def test_ascore_timeout(reranker, monkeypatch):
    real = reranker._compute_logits
    release, finished = threading.Event(), threading.Event()

    def slow(query, passages):
        release.wait(10.0)  # a forward pass that outlives the caller's timeout
        finished.set()
        return real(query, passages)

    monkeypatch.setattr(reranker, "_compute_logits", slow)
    timeouts = reranker.timeouts

    async def main():
        with pytest.raises(RerankerTimeout):
            await reranker.ascore(QUERY, PASSAGES, timeout_s=0.1)
        return finished.is_set()

    # the caller was answered while the pass still ran (it waits for ``release``)
    assert asyncio.run(main()) is False
    release.set()
    assert issubclass(RerankerTimeout, RerankerError)
    assert reranker.timeouts == timeouts + 1
    monkeypatch.setattr(reranker, "_compute_logits", real)
    # The worker recovers once the abandoned pass finishes.
    assert len(asyncio.run(reranker.ascore(QUERY, PASSAGES))) == len(PASSAGES)


def test_constructor_timeout_applies(tiny_model_dir, monkeypatch):
    r = _loaded(tiny_model_dir, timeout_s=0.05)
    try:
        monkeypatch.setattr(r, "_compute_logits", lambda q, p: time.sleep(0.3) or [0.0] * len(p))
        with pytest.raises(RerankerTimeout):
            asyncio.run(r.ascore(QUERY, PASSAGES))
    finally:
        r.close()


# ---------------------------------------------------------------- errors
def test_nan_from_model_raises(reranker, monkeypatch):
    import torch
    from transformers.modeling_outputs import SequenceClassifierOutput

    def nan_forward(input_ids=None, **kw):
        logits = torch.zeros(input_ids.shape[0], 1)
        logits[-1, 0] = float("nan")
        return SequenceClassifierOutput(logits=logits)

    monkeypatch.setattr(reranker._model, "forward", nan_forward)
    with pytest.raises(RerankerError, match="non-finite"):
        reranker.score(QUERY, PASSAGES)
    with pytest.raises(RerankerError, match="non-finite"):
        asyncio.run(reranker.ascore(QUERY, PASSAGES))


def test_inf_and_model_exception_raise(reranker, monkeypatch):
    monkeypatch.setattr(reranker, "_compute_logits", lambda q, p: [float("inf")] * len(p))
    with pytest.raises(RerankerError, match="non-finite"):
        reranker.score(QUERY, PASSAGES)

    def boom(q, p):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(reranker, "_compute_logits", boom)
    with pytest.raises(RerankerError, match="device-side assert") as info:
        reranker.score(QUERY, PASSAGES)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_missing_folder_fails_clearly_and_retry_is_rate_limited(tmp_path):
    missing = tmp_path / "no-such-model"
    r = Reranker(str(missing), device="cpu")
    try:
        assert r.state == "not_loaded"
        with pytest.raises(RerankerUnavailable, match="does not exist"):
            r.load()
        assert r.state == "failed"
        assert "does not exist" in r.last_error and str(missing) in r.last_error
        assert r.load_attempts == 1
        with pytest.raises(RerankerUnavailable, match="not ready"):
            r.score(QUERY, ["x"])
        with pytest.raises(RerankerUnavailable):
            asyncio.run(r.ascore(QUERY, ["x"]))

        # Within retry_after_s: no new attempt.
        assert asyncio.run(r.ensure_loaded_async(retry_after_s=60)) is False
        assert r.load_attempts == 1 and r.state == "failed"
        # Past retry_after_s: retried (and still failing, without raising).
        assert asyncio.run(r.ensure_loaded_async(retry_after_s=0)) is False
        assert r.load_attempts == 2
        assert asyncio.run(r.ensure_loaded_async(retry_after_s=60)) is False
        assert r.load_attempts == 2
        # The model shows up later: the next allowed retry recovers.
        build_tiny_cross_encoder(missing)
        assert asyncio.run(r.ensure_loaded_async(retry_after_s=0)) is True
        assert r.state == "ready" and r.last_error is None and r.load_attempts == 3
        assert len(asyncio.run(r.ascore(QUERY, PASSAGES))) == len(PASSAGES)
        assert asyncio.run(r.ensure_loaded_async()) is True and r.load_attempts == 3
    finally:
        r.close()
    with pytest.raises(RerankerUnavailable):
        asyncio.run(r.ascore(QUERY, ["x"]))


def test_unknown_hub_id_offline_fails_clearly():
    r = Reranker("kb-rerank-tests/definitely-not-a-model", device="cpu")
    try:
        with pytest.raises(RerankerUnavailable) as info:
            asyncio.run(r.aload())
        assert r.state == "failed" and r.last_error
        assert "definitely-not-a-model" in str(info.value)
    finally:
        r.close()


def test_concurrent_ensure_loaded_shares_one_load(tiny_model_dir):
    r = Reranker(str(tiny_model_dir), device="cpu")
    try:
        async def main():
            return await asyncio.gather(*(r.ensure_loaded_async() for _ in range(5)))

        assert asyncio.run(main()) == [True] * 5
        assert r.load_attempts == 1 and r.state == "ready"
        assert r.info()["device"] == "cpu" and r.info()["fp16"] is False
    finally:
        r.close()
    assert r.state == "not_loaded"
