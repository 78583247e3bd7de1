"""The rerank budget (KB_RERANK_BUDGET_MS): the forward cost calibrated at load, batches that
end before the deadline and none that start after it, ONNX runs terminated at the deadline,
partial answers (their order and scores, never cached, finished by the pair cache), the
limiter's pair price from the calibration.

The slow model is the real ``Reranker`` (tiny cross-encoder) on a virtual clock: its forward
pass advances the clock by a fixed time per pair, and the reranker and the scoring step read
that clock, so the calibration, the planning and the live timings all run through the
service's code and give the same answer on an idle machine and on a loaded one. The ONNX
model is a real export whose batches take seconds, on the real clock.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time as real_time
import uuid

import pytest

from kb_rerank.models.cross_encoder import BatchTerminated, Reranker
from kb_rerank.models.forward_cost import ForwardCost
from kb_rerank.rerank import scoring
from kb_rerank.core.costs import Bill, Work
from kb_rerank.core.limits import Limits, RateLimiter
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder, sample_words

QUERY = "how do I export invoices"
WORDS = sample_words()


def passages(n: int, words: int = 30) -> list[str]:
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words)) for i in range(n)]


class VirtualClock:
    """``time`` as the reranker and the scoring step see it: ``monotonic`` and ``perf_counter``
    move only when a forward pass advances them; everything else is the real module."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    perf_counter = monotonic

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def __getattr__(self, name):
        return getattr(real_time, name)


time = VirtualClock()


def on_virtual_clock(mp: pytest.MonkeyPatch) -> None:
    from kb_rerank.models import cross_encoder

    mp.setattr(cross_encoder, "time", time)
    mp.setattr(scoring, "time", time)


@pytest.fixture(autouse=True)
def virtual_clock(request, monkeypatch):
    """Every test on the virtual clock but the ONNX ones (ONNX Runtime stops a run on the real one)."""
    if "onnx" not in request.node.name:
        on_virtual_clock(monkeypatch)
    yield


class SlowReranker(Reranker):
    """The tiny model with each forward pass made ``per_pair_s`` a pair dearer on the virtual
    clock (as a real model's compute would be); records each batch's start and end."""

    def __init__(self, *a, per_pair_s: float = 0.01, **kw) -> None:
        super().__init__(*a, **kw)
        self.per_pair_s = per_pair_s
        self.runs: list[tuple[float, float, int]] = []  # (start, end, pairs), virtual clock

    def _run_batch(self, features, *, deadline=None):
        start = time.monotonic()
        out = super()._run_batch(features, deadline=deadline)
        time.advance(self.per_pair_s * len(features))
        self.runs.append((start, time.monotonic(), len(features)))
        return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("budget-ce") / "model", seed=0)


@pytest.fixture(scope="module")
def slow(tiny_dir):
    r = SlowReranker(str(tiny_dir), device="cpu", batch_size=8, max_length=128, per_pair_s=0.01)
    with pytest.MonkeyPatch.context() as mp:
        on_virtual_clock(mp)
        r.load()  # calibrated on the virtual clock
    yield r
    r.close()


# --------------------------------------------------------------------------- the forward cost


def test_the_cost_line_is_drawn_through_two_batches_and_follows_live_timings():
    c = ForwardCost(max_length=100)
    c.calibrate(one_ms=12.0, batch_ms=42.0, batch=4, length=100)  # 10 + 0.1 ms a token
    assert c.ms_per_token == pytest.approx(0.1) and c.fixed_ms == pytest.approx(2.0)
    assert c.estimate(8, 100) == pytest.approx(82.0)
    # the next pairs (100, 50 and 100 tokens): what fits in 25 ms is two (2 + 0.1 x 2 x 100 = 22)
    assert c.fit([100, 50, 100], 25.0, cap=8) == 2
    assert c.fit([100, 50, 100], 11.0, cap=8) == 0  # not even one pair
    assert c.fit([10] * 20, 1e9, cap=8) == 8  # never more than the batch size
    # a machine twice as slow: the rate moves towards it batch by batch
    for _ in range(10):
        c.observe(4, 100, 2.0 + 0.2 * 400)
    assert c.ms_per_token == pytest.approx(0.2, rel=0.05) and c.observed == 10
    assert c.pairs_within(300.0) == int(300.0 // c.ms_per_pair())
    # a pair is priced at the length live batches have (short passages cost less than full length)
    for _ in range(20):
        c.observe(4, 25, 2.0 + 0.2 * 100)
    assert c.typical_length == pytest.approx(25, rel=0.02) and c.ms_per_pair() < c.ms_per_pair(100) / 3


def test_loading_calibrates_the_cost_of_the_slowed_model(slow):
    # 10 ms a pair on the virtual clock at most 128 tokens: the line says 10 ms a full-length pair
    per_pair = slow.cost.ms_per_token * slow.max_length + slow.cost.fixed_ms
    assert slow.cost.calibrated and per_pair == pytest.approx(10.0, rel=0.2), slow.cost.snapshot()
    assert slow.info()["forward_cost"]["calibrated"] is True


# --------------------------------------------------------------------------- the budget on the model


def test_a_budget_scores_a_prefix_in_order_and_no_batch_starts_after_the_deadline(slow):
    texts = passages(40)
    full = slow.score(QUERY, texts)
    slow.runs.clear()
    deadline = time.monotonic() + 0.15
    got = asyncio.run(slow.ascore_until(QUERY, texts, deadline))
    ended = time.monotonic()
    assert 3 <= len(got) < 40  # 150 ms at ~10 ms a pair
    assert got == pytest.approx(full[: len(got)], abs=1e-6)  # the first ones, in fused order
    assert slow.runs and all(start < deadline for start, _, _ in slow.runs)
    longest = max(end - start for start, end, _ in slow.runs)
    assert ended <= deadline + longest  # over by at most one batch
    assert sum(n for _, _, n in slow.runs) == len(got)


def test_p95_of_the_rerank_time_stays_within_budget_plus_one_batch(slow):
    budget_ms, times, batch_ms = 120.0, [], []
    for i in range(12):
        texts = passages(40, words=20 + i)
        slow.runs.clear()
        t = time.monotonic()
        asyncio.run(slow.ascore_until(QUERY, texts, t + budget_ms / 1000.0))
        times.append((time.monotonic() - t) * 1000.0)
        batch_ms.extend((end - start) * 1000.0 for start, end, _ in slow.runs)
    p95 = statistics.quantiles(times, n=20)[-1]
    assert p95 <= budget_ms + max(batch_ms), (times, max(batch_ms))


def test_a_burst_of_misses_does_no_model_work_past_their_budgets(slow):
    """Eight requests at once, 100 ms each, on one worker: they take turns batch by batch, and
    once every deadline has passed no batch runs; a request that comes next starts at once."""
    async def burst():
        now = time.monotonic()
        deadline = now + 0.1
        slow.runs.clear()
        got = await asyncio.gather(*(slow.ascore_until(QUERY, passages(40, words=25 + i), deadline)
                                     for i in range(8)))
        return deadline, got

    deadline, got = asyncio.run(burst())
    assert all(start < deadline for start, _, _ in slow.runs)
    longest = max(end - start for start, end, _ in slow.runs)
    assert max(end for _, end, _ in slow.runs) <= deadline + longest
    assert sum(1 for g in got if g) >= 2  # turns: more than one request got scores
    t = time.monotonic()
    slow.runs.clear()
    assert len(asyncio.run(slow.ascore_until(QUERY, passages(4), t + 1.0))) == 4
    assert slow.runs[0][0] == t  # nothing was queued behind the burst


def test_a_request_whose_deadline_passed_in_the_queue_does_no_work(slow):
    slow.runs.clear()
    assert asyncio.run(slow.ascore_until(QUERY, passages(10), time.monotonic() - 0.001)) == []
    assert slow.runs == []


# --------------------------------------------------------------------------- ONNX: terminated at the deadline


@pytest.fixture(scope="module")
def onnx_slow(tmp_path_factory):
    """A real ONNX export of a model big enough that one batch of 32 pairs at 512 tokens takes
    seconds (hidden 256, 4 layers), random weights."""
    import onnxruntime  # noqa: F401 - the onnx extra (in dev): missing is an error, not a skip
    from transformers import XLMRobertaConfig

    from kb_rerank.models.onnx import OnnxReranker, export_model
    from kb_rerank.testing.tiny_model import _write, build_vocab

    config = XLMRobertaConfig(vocab_size=len(build_vocab()), hidden_size=256, num_hidden_layers=4,
                              num_attention_heads=4, intermediate_size=1024, max_position_embeddings=514,
                              type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, num_labels=1)
    folder = _write(tmp_path_factory.mktemp("budget-onnx") / "model", config, seed=0)
    root = tmp_path_factory.mktemp("budget-onnx-export")
    export_model(str(folder), root, quantize="none", log=lambda *a: None)
    r = OnnxReranker(str(folder), export_root=root, quantize="none", threads=1, batch_size=32, max_length=512)
    r.load()
    yield r
    r.close()


def test_an_onnx_run_past_its_deadline_is_terminated(onnx_slow):
    feats = onnx_slow._encode(QUERY, [" ".join(WORDS[:600])] * 32)
    t = real_time.monotonic()
    with pytest.raises(BatchTerminated):
        onnx_slow._run_batch(feats, deadline=t + 0.1)
    stopped = real_time.monotonic() - t
    whole = onnx_slow.cost.estimate(32, 512) / 1000.0  # what the batch costs, calibrated at load
    # stopped within the node that was running (a node's share of a batch), long before the end
    assert whole > 0.5 and stopped < 0.1 + whole / 2, (stopped, whole)


def test_an_onnx_budget_stops_work_that_outlives_it(onnx_slow):
    """The planner is told batches are cheap (a stale estimate), so it starts one that cannot
    end in time: ONNX Runtime stops it at the deadline and the request ends on time."""
    real = onnx_slow.cost.ms_per_token, onnx_slow.cost.fixed_ms
    onnx_slow.cost.ms_per_token, onnx_slow.cost.fixed_ms = real[0] / 1000.0, 0.0
    terminated = onnx_slow.terminated
    try:
        t = real_time.monotonic()
        got = asyncio.run(onnx_slow.ascore_until(QUERY, [" ".join(WORDS[:600])] * 32, t + 0.2))
        took = real_time.monotonic() - t
    finally:
        onnx_slow.cost.ms_per_token, onnx_slow.cost.fixed_ms = real
    whole = real[0] * 32 * 512 / 1000.0 + real[1] / 1000.0  # what the batch costs, calibrated at load
    assert got == [] and onnx_slow.terminated == terminated + 1
    assert took < 0.2 + whole / 2, (took, whole)  # stopped long before the batch's end


# --------------------------------------------------------------------------- partial answers


def test_partial_scores_keep_model_order_above_fused_order_within_0_1():
    rel = scoring.partial_relevance([0.9, None, 0.2, None, None, 0.5])
    assert rel[:1] + rel[2:3] + rel[5:] == [0.9, 0.2, 0.5]
    unscored = [rel[1], rel[3], rel[4]]
    assert unscored == sorted(unscored, reverse=True) and max(unscored) < 0.2 and min(unscored) > 0
    assert unscored == pytest.approx([0.2 * 3 / 4, 0.2 * 2 / 4, 0.2 * 1 / 4])


def test_the_score_step_uses_the_pair_cache_first_and_maps_the_rest(slow):
    texts = passages(30)
    keys = [("k", i) for i in range(30)]
    cached = {keys[29]: 0.77, keys[28]: 0.01}  # the last two in fused order: free
    s = asyncio.run(scoring.score(slow, QUERY, texts, keys, cached, budget_ms=60))
    assert s.reason is None and s.partial == "budget" and s.cached == 2
    assert 2 < s.reranked < 30 and s.reranked == s.sent + 2
    by = s.by_model
    assert by[28] and by[29] and by[: s.sent] == [True] * s.sent and not any(by[s.sent:28])
    model = [x for x, b in zip(s.scores, by) if b]
    rest = [x for x, b in zip(s.scores, by) if not b]
    assert max(rest) < min(model) and rest == sorted(rest, reverse=True)
    assert set(s.new_pairs) == set(keys[: s.sent])
    order = scoring.order([str(i) for i in range(30)], s.scores)
    assert [by[i] for i in order] == sorted(by, reverse=True)  # every model score above every fused one


def test_no_time_for_even_one_pair_is_the_model_budget_fallback(slow):
    s = asyncio.run(scoring.score(slow, QUERY, passages(5), [("q", i) for i in range(5)], budget_ms=1))
    assert s.scores is None and s.reason == "model_budget" and s.sent == 0


def test_without_a_budget_every_pair_is_scored(slow):
    s = asyncio.run(scoring.score(slow, QUERY, passages(20), [("z", i) for i in range(20)], budget_ms=0))
    assert s.partial is None and s.sent == 20 and s.reranked == 20


# --------------------------------------------------------------------------- the limiter


def test_a_pair_costs_what_the_calibration_measured():
    cost = ForwardCost(max_length=256)
    lim = Limits(tenant_rate=RateLimiter(0, 1000), cost_per_pair=0.1, cost_per_model_second=400.0)
    assert lim.cost_per_pair == 0.1  # no model measured yet: the fixed price
    lim.pair_cost = cost
    cost.calibrate(one_ms=25.0, batch_ms=100.0, batch=4, length=256)  # 25 ms a pair
    assert lim.cost_per_pair == pytest.approx(cost.ms_per_pair() / 1000 * 400) and lim.cost_per_pair > 9
    cheap = ForwardCost(max_length=256)
    cheap.calibrate(one_ms=0.01, batch_ms=0.04, batch=4, length=256)
    lim.pair_cost = cheap
    assert lim.cost_per_pair == 0.1  # never below the fixed price
    assert Limits(cost_per_pair=0.1, cost_per_model_second=0.0).cost_per_pair == 0.1


def test_pairs_the_budget_did_not_reach_are_given_back():
    async def main():
        lim = Limits(tenant_rate=RateLimiter(60, 100, clock=lambda: 0.0), cost_per_pair=1.0)
        bill = Bill(lim, "t")
        bill.reserve(Work(pairs=10))
        assert lim.tenant_rate.level("t") == pytest.approx(90)
        async with bill.model(10):
            pass
        bill.scored(4)  # the budget ended after four
        bill.settle()
        assert lim.tenant_rate.level("t") == pytest.approx(96)
        more = Bill(lim, "t")
        async with more.model(2):  # nothing reserved: two charged at the slot
            pass
        more.scored(3)  # one more than estimated: debited
        more.settle()
        assert lim.tenant_rate.level("t") == pytest.approx(93)

    asyncio.run(main())


# --------------------------------------------------------------------------- through the app


def test_a_partial_answer_says_so_is_not_cached_and_the_pair_cache_finishes_it(
        settings, embedder, tiny_dir, app_conn, tmp_path):
    from tests.helpers import insert_doc
    from tests.endpoints.test_rerank_route import bearer, client_for

    tenant = uuid.uuid4()
    texts = [f"To export invoices, step {i}: " + " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(40))
             for i in range(40)]
    vectors = [embedder.embed_query(t) for t in texts]
    for i, (text, vec) in enumerate(zip(texts, vectors)):
        insert_doc(app_conn, tenant, f"Exporting invoices {i}", [text], [vec])
    r = SlowReranker(str(tiny_dir), device="cpu", batch_size=4, max_length=128, per_pair_s=0.01)
    r.load()
    try:
        with client_for(settings, r, embedder, rerank_budget_ms=120) as client:
            first = client.post("/v1/kb/search/rerank", json={"query": "export invoices step"},
                                headers=bearer(tenant))
            body = first.json()
            assert body["fallback"] is False and body["partial_reason"] == "budget"
            assert first.headers["x-kb-partial"] == "budget" and "x-kb-fallback" not in first.headers
            assert body["model"] == r.model_name and body["ranked_by"] == "model"
            n, k = body["candidate_count"], body["reranked_count"]
            assert 0 < k < n
            by = [x["scored_by"] for x in body["results"]]
            assert by == sorted(by, key=lambda b: b != "model")  # the model's first, then fused order
            scored = [x for x in body["results"] if x["scored_by"] == "model"]
            scores = [x["rerank_score"] for x in scored]
            assert scores == sorted(scores, reverse=True) and all(0 <= x <= 1 for x in scores)
            # those the budget did not reach: no relevance (the same rule as a fallback's), their fused score
            unscored = [x for x in body["results"] if x["scored_by"] == "fused"]
            assert len(scored) == min(k, len(body["results"])) and len(unscored) == len(body["results"]) - len(scored)
            assert all(x["rerank_score"] is None and isinstance(x["fused_score"], float) for x in unscored)
            # not cached: the next request is a miss that starts from the pair scores and goes further
            again = client.post("/v1/kb/search/rerank", json={"query": "export invoices step"},
                                headers=bearer(tenant)).json()
            assert again["from_cache"] is False and again["reranked_count"] > k
            for _ in range(20):
                if again["partial_reason"] is None:
                    break
                again = client.post("/v1/kb/search/rerank", json={"query": "export invoices step"},
                                    headers=bearer(tenant)).json()
            assert again["partial_reason"] is None and again["reranked_count"] == again["candidate_count"]
            assert {x["scored_by"] for x in again["results"]} == {"model"}
            hit = client.post("/v1/kb/search/rerank", json={"query": "export invoices step"},
                              headers=bearer(tenant)).json()
            assert hit["from_cache"] is True and hit["results"] == again["results"]
            # /readyz (with the ops token) tells what this machine affords within the budget
            from tests.live_server import OPS

            ready = client.get("/readyz", headers=OPS).json()["model"]["rerank_budget"]
            assert ready["budget_ms"] == 120 and ready["calibrated"] is True and ready["candidates"] == 40
            assert 1 <= ready["scored_within_budget"] < 40 and ready["ms_per_pair"] > 5
            metrics = client.get("/metrics", headers=OPS).text
            assert 'kb_rerank_partial_answers_total{reason="budget",source="hybrid_lexical_semantic"}' in metrics
    finally:
        r.close()
