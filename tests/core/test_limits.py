"""Limits and fairness (kb_rerank.core.limits): cost-based token buckets, the
per-tenant caps on model work and pool connections, the per-address bucket before
authentication. Unit tests use a fake clock (no sleeps); the HTTP tests run the app.
The load test (one tenant floods misses, another's cache hits stay fast) is in
tests/project/test_load.py."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import httpx
import pytest
from litestar.testing import TestClient

from kb_rerank.app import create_app
from kb_rerank.core.costs import Bill, Work
from kb_rerank.core.limits import Limits, LimitExceeded, RateLimiter, Slots
from kb_rerank.core.settings import Settings

from tests.live_server import OPS, OPS_TOKEN, SECRET, URL, FakeReranker, bearer, serve_in_thread


def _clock():
    now = [0.0]
    return now, (lambda: now[0])


# --------------------------------------------------------------------------- token buckets


def test_bucket_charges_by_cost_and_refills():
    now, clock = _clock()
    rl = RateLimiter(60, 10, clock=clock)  # 1 token/s, 10 at most
    assert rl.acquire("a", 5) == 0.0 and rl.acquire("a", 4) == 0.0
    assert rl.level("a") == pytest.approx(1.0)
    assert rl.acquire("a", 3) == pytest.approx(2.0)  # refused: 2 s until 3 tokens; nothing taken
    assert rl.level("a") == pytest.approx(1.0)
    assert rl.acquire("a", 1) == 0.0  # a cache hit still fits
    now[0] += 3.0
    assert rl.acquire("a", 3) == 0.0
    assert rl.acquire("b", 10) == 0.0  # another key has its own bucket


def test_bucket_cost_above_size_needs_a_full_bucket_and_leaves_debt():
    now, clock = _clock()
    rl = RateLimiter(60, 10, clock=clock)
    assert rl.acquire("a", 1) == 0.0
    # 101 tokens (1000 documents at 0.1): not on a bucket that is not full
    assert rl.acquire("a", 101) == pytest.approx(1.0)
    now[0] += 1.0
    assert rl.acquire("a", 101) == 0.0  # full: let through, 91 tokens in debt
    assert rl.level("a") == pytest.approx(-91.0)
    assert rl.acquire("a", 1) == pytest.approx(92.0)  # even a cache hit waits the debt out
    now[0] += 92.0
    assert rl.acquire("a", 1) == 0.0
    # `paid`: the request's first token, taken earlier, counts towards "a full bucket"
    assert rl.acquire("b", 1) == 0.0
    assert rl.acquire("b", 101) == pytest.approx(1.0)
    assert rl.acquire("b", 101, paid=1) == 0.0 and rl.level("b") == pytest.approx(-92.0)


def test_a_retry_after_the_wait_it_was_told_is_let_through():
    """A request costing more than the bucket holds is told how long to wait; its retry pays
    its first token again (the auth guard's) and must then pass, not fall one token short."""
    now, clock = _clock()
    rl = RateLimiter(60, 60, clock=clock)  # 1 token a second, 60 at most
    key = "a"
    rl.acquire(key, 30)  # 30 left
    for _ in range(3):  # a client that follows Retry-After every time
        assert rl.acquire(key, 1) == 0.0  # the auth guard's first token
        wait = rl.acquire(key, 105, paid=1)  # the request's price: above the bucket's size
        if wait == 0.0:
            break
        now[0] += wait
    assert wait == 0.0 and rl.level(key) < 0  # let through on the first retry, in debt


def test_many_clients_of_one_tenant_retrying_together_are_slowed_not_shut_out():
    """24 clients of one tenant each pay their first token, then ask for a price close to the
    bucket's size, and retry together when told: a refusal gives the first token back, so the
    bucket still fills and one request at a time is let through."""
    now, clock = _clock()
    lim = Limits(tenant_rate=RateLimiter(600, 60, clock=clock))  # 10 tokens a second, 60 at most
    key, clients, price = "a", 24, 58.0
    admitted, waits = 0, [0.0] * clients
    for _ in range(40):  # rounds: every client whose wait is over sends its request again
        due = []
        for i in range(clients):
            if waits[i] <= 0:
                try:
                    lim.charge(key)  # the auth guard's token
                    due.append(i)
                except LimitExceeded as exc:
                    waits[i] = float(exc.headers["Retry-After"])
        for i in due:
            try:
                lim.charge(key, price, paid=1.0)
                admitted += 1
                waits[i] = 0.0
            except LimitExceeded as exc:
                waits[i] = float(exc.headers["Retry-After"])  # whole seconds, as a client reads it
        step = min([w for w in waits if w > 0] or [0.1])
        now[0] += step
        waits = [w - step for w in waits]
    # 10 tokens a second for 58-token requests: about one every 6 s, not none
    assert admitted >= 3, admitted
    assert lim.tenant_rate.level(key) <= 60.0


def test_bucket_disabled_and_bounded_memory():
    now, clock = _clock()
    rl = RateLimiter(60, 2, max_tenants=3, clock=clock)
    for t in range(10):
        rl.acquire(f"t{t}", 1)
    assert len(rl) <= 3
    off = RateLimiter(0, 60)
    assert all(off.acquire("x", 1000) == 0.0 for _ in range(100)) and len(off) == 0


def test_limits_costs_and_429_payload():
    now, clock = _clock()
    rejected = []
    lim = Limits(tenant_rate=RateLimiter(60, 20, clock=clock), address_rate=RateLimiter(60, 2, clock=clock),
                 cost_per_pair=0.1, cost_per_document=0.1, on_reject=rejected.append)
    t = uuid.uuid4()
    lim.charge(t)  # a cache hit: 1
    Bill(lim, t).reserve(Work(pairs=40))  # a 40-pair miss: 4 more
    assert lim.tenant_rate.level(t) == pytest.approx(15.0)
    Bill(lim, t).admit(Work(documents=100))  # 100 documents: 10
    assert lim.tenant_rate.level(t) == pytest.approx(5.0)
    lim.charge(t, -1)  # nothing
    lim.cost_per_embedding = 0.5
    Bill(lim, t).admit(Work(documents=10, embeddings=4))  # 1 + 2: documents and MMR passages in one charge
    assert lim.tenant_rate.level(t) == pytest.approx(2.0)
    now[0] += 3.0
    with pytest.raises(LimitExceeded) as ei:
        Bill(lim, t).admit(Work(documents=1000))
    exc = ei.value
    # needs the bucket full before the request (20 - its first token = 19 now), and the retry
    # pays its first token again: 15 s away
    assert exc.status_code == 429 and exc.headers["Retry-After"] == "15"
    assert exc.payload == {"error": "rate_limited", "scope": "tenant", "cost": 100.0, "retry_after_s": 15}
    lim.charge_address("10.0.0.1")
    lim.charge_address("10.0.0.1")
    with pytest.raises(LimitExceeded) as ei:
        lim.charge_address("10.0.0.1")
    assert ei.value.payload["scope"] == "address"
    lim.charge_address("10.0.0.2")  # another address is not affected
    assert rejected == ["rate_limited", "address_rate_limited"]


def test_limits_from_settings_defaults_from_the_pool():
    lim = Limits.from_settings(Settings(pool_max=10))
    assert lim.pool.cap == 5 and lim.model.cap == 2 and lim.embedder.cap == 2
    assert lim.cost_per_pair == 0.1 and lim.cost_per_document == 0.1
    assert lim.address_rate.enabled and lim.tenant_rate.enabled
    assert Limits.from_settings(Settings(pool_max=3)).pool.cap == 1
    assert Limits.from_settings(Settings(tenant_pool_slots=7)).pool.cap == 7
    off = Limits.from_settings(Settings(tenant_pool_slots=-1, tenant_model_slots=0, address_rate_limit_per_minute=0))
    assert off.pool.cap < 0 and off.model.cap == 0 and not off.address_rate.enabled


# --------------------------------------------------------------------------- caps


def test_slots_cap_per_key_and_refusal_without_wait():
    async def main():
        s = Slots(2, 0.0, "model")
        await s.acquire("a")
        await s.acquire("a")
        with pytest.raises(LimitExceeded) as ei:
            await s.acquire("a")
        assert ei.value.payload["error"] == "tenant_busy" and ei.value.payload["resource"] == "model"
        assert ei.value.status_code == 429 and int(ei.value.headers["Retry-After"]) >= 1
        await s.acquire("b")  # another tenant is served
        s.release("a")
        await s.acquire("a")
        for k in ("a", "a", "b"):
            s.release(k)
        assert s.busy_keys() == 0  # idle keys are forgotten

    asyncio.run(main())


def test_slots_waiters_get_released_slots_in_order():
    async def main():
        s = Slots(1, 30.0, "database")
        await s.acquire("a")
        order = []

        async def waiter(i):
            await s.acquire("a")
            order.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await asyncio.sleep(0)  # let them queue (one loop turn, not a timed wait)
        assert s.waiting("a") == 3 and s.held("a") == 1
        for _ in range(3):
            s.release("a")
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        assert order == [0, 1, 2] and s.held("a") == 1
        s.release("a")
        assert s.busy_keys() == 0 and s.waiting("a") == 0
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_slots_bounded_wait_then_429_and_cancelled_waiter_leaks_nothing():
    async def main():
        s = Slots(1, 0.05, "database")
        await s.acquire("a")
        with pytest.raises(LimitExceeded):
            await s.acquire("a")  # waits 0.05 s at most
        assert s.waiting("a") == 0 and s.held("a") == 1
        task = asyncio.create_task(s.acquire("a"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        s.release("a")
        assert s.busy_keys() == 0 and s.waiting("a") == 0
        # a slot handed to a waiter that is cancelled at the same moment passes on
        await s.acquire("a")
        t1 = asyncio.create_task(s.acquire("a"))
        await asyncio.sleep(0)
        s.release("a")  # handed to t1 ...
        t1.cancel()  # ... which is cancelled before it runs
        with contextlib.suppress(asyncio.CancelledError):
            await t1
        if t1.cancelled():
            assert s.busy_keys() == 0
        else:  # it got the slot before the cancel landed
            s.release("a")
            assert s.busy_keys() == 0

    asyncio.run(main())


def test_slots_held_past_the_cap_are_released_before_a_waiter_is_let_in():
    """Holders taken unbounded (a tenant alone) count: once bounded, a waiter is let in only
    when the holders are below the cap again."""
    async def main():
        s = Slots(1, 30.0, "retrieval")
        for _ in range(3):
            await s.acquire("a", bounded=False)
        assert s.held("a") == 3
        got = asyncio.create_task(s.acquire("a"))
        await asyncio.sleep(0)
        assert s.waiting("a") == 1
        s.release("a")
        s.release("a")
        await asyncio.sleep(0)
        assert not got.done() and s.held("a") == 1  # two released, one still held: at the cap
        s.release("a")
        await got
        assert s.held("a") == 1 and s.waiting("a") == 0
        s.release("a")
        assert s.busy_keys() == 0

    asyncio.run(main())


def test_retrieval_slots_cap_a_tenant_only_while_another_is_served():
    """Alone, a tenant's retrievals are not capped; once another tenant sends a request,
    one more than its cap waits, then 429 tenant_busy with Retry-After, while the other
    tenant's retrieval is served; one retrieval after another never waits."""
    async def main():
        lim = Limits(retrieval_slots=1, wait_s=0.05, shared_window_s=10.0)
        lim.charge("a")
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(3):  # alone: all three at once
                await stack.enter_async_context(lim.retrieval_slot("a"))
            assert lim.retrieval.held("a") == 3
        lim.charge("b")  # shared from now on
        for _ in range(5):  # one after another: never refused
            async with lim.retrieval_slot("a"):
                pass
        async with lim.retrieval_slot("a"):
            with pytest.raises(LimitExceeded) as ei:
                async with lim.retrieval_slot("a"):
                    pass
            assert ei.value.payload == {"error": "tenant_busy", "resource": "retrieval",
                                        "detail": "this tenant already uses 1 retrieval slots", "retry_after_s": 1}
            assert ei.value.headers["Retry-After"] == "1"
            async with lim.retrieval_slot("b"):  # another tenant is served meanwhile
                assert lim.retrieval.held("b") == 1
        assert lim.retrieval.busy_keys() == 0
        assert Limits.from_settings(Settings()).retrieval.cap == 1
        assert Limits.from_settings(Settings(tenant_retrieval_slots=0)).retrieval.cap == 0  # disabled

    asyncio.run(main())


class _FakePool:
    """connection() holds one of ``size`` connections until the block exits."""

    def __init__(self, size):
        self.sem = asyncio.Semaphore(size)
        self.in_use = 0

    @contextlib.asynccontextmanager
    async def connection(self):
        async with self.sem:
            self.in_use += 1
            try:
                yield object()
            finally:
                self.in_use -= 1


def test_pool_share_per_tenant_leaves_connections_for_others():
    async def main():
        pool = _FakePool(4)
        lim = Limits(pool_slots=2, wait_s=0.05)
        a, b = "tenant-a", "tenant-b"
        release = asyncio.Event()
        held = 0

        async def hold(t):
            nonlocal held
            async with lim.connection(pool, t):
                held += 1
                await release.wait()

        flood = [asyncio.create_task(hold(a)) for _ in range(10)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert pool.in_use == 2 and lim.pool.held(a) == 2  # A holds its share, no more
        async with lim.connection(pool, b):  # B is served at once
            assert pool.in_use == 3
        done = await asyncio.gather(*flood[2:], return_exceptions=True)  # A's others time out: 429
        assert all(isinstance(x, LimitExceeded) and x.payload["resource"] == "database" for x in done)
        release.set()
        await asyncio.gather(*flood[:2])
        assert pool.in_use == 0 and lim.pool.busy_keys() == 0

    asyncio.run(main())


def test_pairs_beyond_the_reservation_are_charged_before_the_model_slot():
    async def main():
        now, clock = _clock()
        lim = Limits(tenant_rate=RateLimiter(60, 10, clock=clock), model_slots=1, cost_per_pair=0.1)
        bill = Bill(lim, "a")
        async with bill.model(40):  # 4 tokens (none reserved), one slot
            assert lim.tenant_rate.level("a") == pytest.approx(6.0) and lim.model.held("a") == 1
            with pytest.raises(LimitExceeded) as ei:
                async with Bill(lim, "a").model(10):  # slot busy, no wait
                    pass
            assert ei.value.payload["error"] == "tenant_busy"
        lim.charge("a")  # the next request's first token (the auth guard's)
        with pytest.raises(LimitExceeded) as ei:
            async with Bill(lim, "a").model(70):  # 7 tokens: short
                pass
        assert ei.value.payload["error"] == "rate_limited" and lim.model.held("a") == 0
        assert lim.tenant_rate.level("a") == pytest.approx(6.0)  # refused: its first token given back
        prepaid = Bill(lim, "a")
        prepaid._admitted = Work(pairs=70)  # /v2/rerank's documents paid their pairs
        async with prepaid.model(70):
            pass
        assert lim.tenant_rate.level("a") == pytest.approx(6.0)

    asyncio.run(main())


def test_a_miss_is_charged_whole_before_its_work_and_settled_after():
    """Concurrent misses of one tenant: each reserves its embedding and its most pairs in one
    charge, so the bucket admits whole misses and refuses the rest before any work (charged
    stage by stage, every miss paid an embedding and then all were refused their pairs: a
    flood served nothing). Unsent pairs are given back when the request ends."""
    async def main():
        now, clock = _clock()
        lim = Limits(tenant_rate=RateLimiter(60, 20, clock=clock), cost_per_pair=0.1, cost_per_embedding=4.0)
        # the auth guard's token, then the miss: 4 + 40 x 0.1 = 8
        admitted = []
        for _ in range(3):
            lim.charge("a")
            bill = Bill(lim, "a")
            try:
                bill.reserve(Work(embeddings=1, pairs=40))
                admitted.append(bill)
            except LimitExceeded as exc:
                assert exc.payload["cost"] == 8.0
        assert len(admitted) == 2  # 20 tokens: two whole misses, the third refused up front
        # (and given its first token back: a refusal costs nothing)
        assert lim.tenant_rate.level("a") == pytest.approx(20 - 2 - 16)
        for bill, pairs in zip(admitted, (25, 0)):  # sent 25 of 40 pairs: 1.5 back; all cached: 4 back
            async with bill.embedder(1):
                pass
            if pairs:
                async with bill.model(pairs):
                    pass
            bill.settle()
        assert lim.tenant_rate.level("a") == pytest.approx(2 + 1.5 + 4.0)

    asyncio.run(main())


def test_a_refused_slot_gives_the_miss_reservation_back():
    """A miss reserved whole, then refused its embedder slot (or its model slot) as
    tenant_busy, keeps no tokens for work it never did."""
    async def main():
        now, clock = _clock()
        lim = Limits(tenant_rate=RateLimiter(60, 20, clock=clock), model_slots=1, cost_per_pair=0.1,
                     cost_per_embedding=4.0)
        async with lim.embedder_slot("a"):  # the tenant's one embedder slot, held elsewhere
            bill = Bill(lim, "a")
            bill.reserve(Work(embeddings=1, pairs=40))
            assert lim.tenant_rate.level("a") == pytest.approx(12.0)
            with pytest.raises(LimitExceeded) as ei:
                async with bill.embedder(1):
                    pass
            assert ei.value.payload["error"] == "tenant_busy"
            bill.settle()
            assert lim.tenant_rate.level("a") == pytest.approx(20.0)
        # the model slot: busy, so the 25 pairs are not sent
        async with lim.model_slot("a"):
            bill = Bill(lim, "a")
            bill.reserve(Work(pairs=40))
            with pytest.raises(LimitExceeded):
                async with bill.model(25):
                    pass
            bill.settle()
            assert lim.tenant_rate.level("a") == pytest.approx(20.0)

    asyncio.run(main())


def test_debit_is_never_refused_and_may_leave_a_debt():
    now, clock = _clock()
    rl = RateLimiter(60, 10, clock=clock)  # 1 token/s, 10 at most
    assert rl.acquire("a", 4) == 0.0
    rl.debit("a", 5)
    assert rl.level("a") == pytest.approx(1.0)
    rl.debit("a", 7)  # more than the bucket holds: taken all the same
    assert rl.level("a") == pytest.approx(-6.0)
    assert rl.acquire("a", 1) == pytest.approx(7.0)  # even a cache hit waits the debt out
    assert rl.level("a") == pytest.approx(-6.0)  # (the refusal took nothing)
    now[0] += 3.0  # refills from the negative level
    assert rl.level("a") == pytest.approx(-3.0)
    now[0] += 4.0
    assert rl.acquire("a", 1) == 0.0 and rl.level("a") == pytest.approx(0.0)
    now[0] += 100.0
    assert rl.level("a") == pytest.approx(10.0)  # never above the size
    # an absent bucket starts full, less the debit; more than the size is allowed
    rl.debit("b", 25)
    assert rl.level("b") == pytest.approx(-15.0)
    # nothing for a cost <= 0
    rl.debit("c", 0)
    rl.debit("c", -3)
    assert rl.level("c") == pytest.approx(10.0) and "c" not in rl._buckets


def test_debit_on_a_disabled_limiter_is_a_no_op():
    rl = RateLimiter(0, 10)
    rl.debit("a", 50)
    assert len(rl) == 0 and rl.acquire("a", 1) == 0.0


def test_embeddings_beyond_the_admission_are_debited_when_the_request_ends():
    async def main():
        _now, clock = _clock()
        lim = Limits(tenant_rate=RateLimiter(60, 100, clock=clock), cost_per_document=0.1, cost_per_embedding=4.0)
        lim.charge("a")  # the request's token
        bill = Bill(lim, "a")
        bill.admit(Work(documents=10, embeddings=2))  # 1 + 8
        assert lim.tenant_rate.level("a") == pytest.approx(100 - 1 - 1 - 8)
        async with bill.embedder(5):  # 2 paid, 3 beyond: owed, not charged yet
            pass
        assert lim.tenant_rate.level("a") == pytest.approx(100 - 1 - 1 - 8)
        async with bill.embedder(25):  # beyond what the bucket holds: never refused
            pass
        bill.settle()
        assert lim.tenant_rate.level("a") == pytest.approx(100 - 1 - 1 - 8 - 112)
        with pytest.raises(LimitExceeded):
            lim.charge("a")  # the next request waits the debt out
        level = lim.tenant_rate.level("a")
        bill.settle()  # once: nothing more
        assert lim.tenant_rate.level("a") == pytest.approx(level)
        async with bill.embedder(1):  # a late batch, after the request ended: debited at once
            pass
        assert lim.tenant_rate.level("a") == pytest.approx(level - 4.0)
        # disabled: nothing
        off = Limits(cost_per_embedding=4.0)
        late = Bill(off, "a")
        async with late.embedder(10):
            pass
        late.settle()
        assert len(off.tenant_rate) == 0

    asyncio.run(main())


def _app(settings, embedder, reranker=None, **changes):
    # the full prices (the service shared): what these tests measure; a tenant alone pays one
    # token a request (tests/core/test_ordinary_use_limits.py)
    changes.setdefault("rate_work_conserving", False)
    return create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, **changes), reranker=reranker or FakeReranker(),
                      embedder=embedder)


def test_address_limit_applies_before_authentication(settings, embedder):
    app = _app(settings, embedder, address_rate_limit_per_minute=60, address_rate_limit_burst=3)
    with TestClient(app) as client:
        bad = {"Authorization": "Bearer not.a.token"}
        assert [client.post(URL, json={"query": "x"}, headers=bad).status_code for _ in range(3)] == [401] * 3
        r = client.post(URL, json={"query": "x"}, headers=bad)
        assert r.status_code == 429 and r.headers["retry-after"] == "1" and r.headers["x-trace-id"]
        assert r.json() == {"error": "rate_limited", "scope": "address", "cost": 1.0, "retry_after_s": 1}
        # a valid token from the same address is refused too: the limit is on the address
        assert client.post(URL, json={"query": "x"}, headers=bearer(uuid.uuid4())).status_code == 429
        assert 'kb_rerank_rejected_total{reason="address_rate_limited"} 2.0' in client.get("/metrics", headers=OPS).text
        assert client.get("/healthz").status_code == 200  # unguarded operational routes are not limited


def test_cache_hit_costs_one_and_a_miss_its_pairs(settings, embedder, sample_tenant):
    rr = FakeReranker()
    app = _app(settings, embedder, rr, rate_limit_per_minute=1, rate_limit_burst=100)  # refill ~0 during the test
    with TestClient(app) as client:
        bucket = app.state.limits.tenant_rate
        body = {"query": "how do refunds work limits test", "source": "lexical_only"}
        r = client.post(URL, json=body, headers=bearer(sample_tenant))
        assert r.status_code == 200 and not r.json()["from_cache"]
        pairs = r.json()["candidate_count"]
        assert pairs > 0 and rr.calls == 1
        after_miss = bucket.level(sample_tenant)
        assert after_miss == pytest.approx(100 - 1 - 0.1 * pairs, abs=0.05)
        r = client.post(URL, json=body, headers=bearer(sample_tenant))
        assert r.status_code == 200 and r.json()["from_cache"]
        assert bucket.level(sample_tenant) == pytest.approx(after_miss - 1, abs=0.05)


def test_v2_many_documents_cannot_slip_in_on_one_token(settings, embedder):
    app = _app(settings, embedder, rate_limit_per_minute=60, rate_limit_burst=60, v2_max_body_bytes=4_000_000)
    tenant = uuid.uuid4()
    docs = [f"document number {i} about invoices" for i in range(1000)]
    # lambda 1: no MMR, but the learned injection detector embeds the scored documents (at
    # most rerank_max_candidates), charged with the documents
    s = settings
    cost = round(s.rate_cost_per_document * 1000 + s.rate_cost_per_embedding * min(1000, s.rerank_max_candidates), 3)
    assert cost == 300.0
    with TestClient(app) as client:
        h = bearer(tenant)
        assert client.post("/v2/rerank", json={"query": "q1", "documents": docs[:5], "lambda": 1.0}, headers=h).status_code == 200
        # 1 + 300 tokens: refused on a bucket that is not full, before any work on the documents
        r = client.post("/v2/rerank", json={"query": "q2", "documents": docs, "lambda": 1.0}, headers=h)
        assert r.status_code == 429 and r.json()["error"] == "rate_limited" and r.json()["cost"] == cost
        assert int(r.headers["retry-after"]) >= 1
        other = uuid.uuid4()  # a full bucket lets it through, and the debt is paid by waiting
        r = client.post("/v2/rerank", json={"query": "q3", "documents": docs, "lambda": 1.0}, headers=bearer(other))
        assert r.status_code == 200, r.text
        r = client.post(URL, json={"query": "after the big one"}, headers=bearer(other))
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 40  # ~41 tokens of debt at 1/s


def test_per_tenant_model_cap_refuses_the_flooder_and_serves_the_others(settings, embedder):
    """Tenant A sends 4 concurrent /v2/rerank misses; the model (fake, 1.5 s a call) takes
    one of A's at a time with a short wait: A gets 429 tenant_busy for the rest while
    tenant B, concurrently, is served."""
    rr = FakeReranker(delay_s=1.5)
    app = _app(settings, embedder, rr, rate_limit_per_minute=0, tenant_model_slots=1, tenant_wait_s=0.3)
    a, b = uuid.uuid4(), uuid.uuid4()

    async def drive(base):
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            def post(t, i):
                return client.post("/v2/rerank", headers=bearer(t),
                                   json={"query": f"cap {i}", "documents": ["one doc", "two doc"], "lambda": 1.0})
            flood = [post(a, i) for i in range(4)]
            quiet = asyncio.sleep(0.1, None)

            async def later():
                await quiet
                return await post(b, 99)
            return await asyncio.gather(*flood, later())

    with serve_in_thread(app) as base:
        *flood, quiet = asyncio.run(drive(base))
    codes = sorted(r.status_code for r in flood)
    assert codes == [200, 429, 429, 429], [r.text for r in flood]
    busy = [r.json() for r in flood if r.status_code == 429]
    # the one slot is held by A's first request: the others wait for it at the embedder (the
    # guard's passages) or at the model, whichever that request is in; both are capped
    assert all(x["error"] == "tenant_busy" and x["resource"] in ("model", "embedder") for x in busy)
    assert quiet.status_code == 200, quiet.text


# --------------------------------------------------------------------------- /v2/rerank spans, charged after the fact
# The guard embeds the spans of the documents the classifier finds doubtful (span-level
# scoring): admission charges the documents and the passages only (as before span
# scoring), and the spans actually embedded are debited when the request ends, whatever the
# bucket holds (it may go negative: a debt the tenant's next requests wait out). DOUBTFUL:
# tests/guard/test_guard_classifier.py's PARAPHRASED_MISSED after an ordinary sentence, long enough to
# have spans (> SPAN_MIN_CHARS); the shipped weights find it doubtful (probability >= span_gate)
# and do not flag it by its whole text (spans are scored only where they can change the
# decision): checked here, not assumed.


# span scoring as the weights 2026-12-01.2 to .5 had it, at a threshold of 0.98 (the shipped
# 2026-12-01.6 point scores no spans; the charging of spans is tested for weights that do)
SPANNING_THRESHOLD = 0.98


@pytest.fixture
def spanning(monkeypatch):
    import dataclasses

    from kb_rerank.guard import classifier as gc

    weights = dataclasses.replace(gc.load_shipped(), span_threshold=0.98, span_gate=0.3)
    monkeypatch.setattr(gc, "load_shipped", lambda: weights)
    return weights


def _span_fixtures(embedder, n_doubtful=1):
    from kb_rerank.guard.detectors import detect_injection
    from kb_rerank.guard.classifier import SPAN_MAX, SPAN_MIN_CHARS, spans
    from kb_rerank.guard.verdict import guard_classifier

    from tests.guard.test_guard_classifier import LONG_PLAIN, ORDINARY, PARAPHRASED_MISSED

    doubtful = [f"{ORDINARY[1].split('. ')[0]}. {PARAPHRASED_MISSED}" + (f" ({i})" if i else "")
                for i in range(n_doubtful)]
    benign = [LONG_PLAIN, ORDINARY[0] + " " + ORDINARY[1]]
    clf = guard_classifier(embedder)
    assert clf is not None and clf.span_threshold is not None
    texts = doubtful + benign
    ps = [clf.probability(v, detect_injection(t)) for t, v in zip(texts, embedder.embed_passages(texts))]
    assert all(clf.wants_spans(p) for p in ps[:n_doubtful]) and not any(clf.wants_spans(p) for p in ps[n_doubtful:]), ps
    assert all(p < SPANNING_THRESHOLD for p in ps[:n_doubtful]), ps  # not flagged whole
    assert all(len(t) > SPAN_MIN_CHARS for t in texts)
    n_spans = [len(spans(t)) for t in doubtful]
    assert all(0 < n < SPAN_MAX for n in n_spans)  # a charge of SPAN_MAX a document, or of none, would show
    return doubtful, benign, sum(n_spans)


class TextCountingEmbedder:
    """The session's embedder, counting the passage texts it embeds (passages and spans)."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.passage_texts = 0

    def embed_query(self, text):
        return self.inner.embed_query(text)

    def embed_passages(self, texts):
        self.passage_texts += len(texts)
        return self.inner.embed_passages(texts)


def _spy_charges(app):
    """The tokens taken by Limits.charge (the request's token, then admission's charge; the
    prepaid embedder and model slots charge 0, not listed) and the embeddings debited after
    the fact (RateLimiter.debit, in texts)."""
    lim = app.state.limits
    charges, spans = [], []
    charge, debit = lim.charge, lim.tenant_rate.debit

    def spy_charge(tenant, cost=1.0, **k):
        if cost:
            charges.append(round(float(cost), 6))
        return charge(tenant, cost, **k)

    def spy_debit(tenant, cost):
        spans.append(round(cost / lim.cost_per_embedding))
        return debit(tenant, cost)

    lim.charge, lim.tenant_rate.debit = spy_charge, spy_debit
    return charges, spans


def _spans_app(settings, embedder, burst=200, budget_ms=60_000):
    """An app whose tenant bucket refills about nothing during a test (1 token a minute) and
    whose guard has time to embed every span (the span-charging tests). The lexical vote is
    off: a text it flags needs no spans, and these tests count the spans of doubtful texts."""
    return _app(settings, embedder, rate_limit_per_minute=1, rate_limit_burst=burst,
                guard_budget_ms=budget_ms, guard_embed_timeout_s=budget_ms / 1000,
                guard_classifier_threshold=SPANNING_THRESHOLD, guard_lexical_threshold=1.0)


def test_v2_spans_actually_embedded_are_charged_when_the_request_ends(settings, embedder, spanning):
    doubtful, benign, n_spans = _span_fixtures(embedder)
    s = settings
    counting = TextCountingEmbedder(embedder)
    app = _spans_app(settings, counting)
    charges, debits = _spy_charges(app)
    tenant = uuid.uuid4()
    docs = [doubtful[0], benign[0]]
    body = {"query": "summarise the article", "documents": docs, "lambda": 0.6}
    with TestClient(app) as client:
        bucket = app.state.limits.tenant_rate
        before = counting.passage_texts
        r = client.post("/v2/rerank", json=body, headers=bearer(tenant))
        assert r.status_code == 200, r.text
        embedded = counting.passage_texts - before  # the 2 passages and the spans of the doubtful one
        spans = embedded - 2
        assert spans > 0 and spans == n_spans and debits == [spans]
        # admission: the documents and the 2 passages only (no reservation for spans)
        assert charges[-2:] == [1.0, round(s.rate_cost_per_document * 2 + s.rate_cost_per_embedding * 2, 6)]
        expected = 200 - 1 - s.rate_cost_per_document * 2 - s.rate_cost_per_embedding * (2 + spans)
        assert bucket.level(tenant) == pytest.approx(expected, abs=0.1)
        # the same request again: a cache hit embeds nothing and pays nothing for spans
        r = client.post("/v2/rerank", json=body, headers=bearer(tenant))
        assert r.status_code == 200 and r.json()["meta"]["from_cache"], r.text
        assert debits == [spans] and counting.passage_texts - before == embedded
        expected -= 1 + s.rate_cost_per_document * 2 + s.rate_cost_per_embedding * 2
        assert bucket.level(tenant) == pytest.approx(expected, abs=0.1)


def test_v2_benign_documents_pay_nothing_for_spans(settings, embedder, spanning):
    _doubtful, benign, _n = _span_fixtures(embedder)
    s = settings
    app = _spans_app(settings, embedder)
    charges, debits = _spy_charges(app)
    tenant = uuid.uuid4()
    with TestClient(app) as client:
        r = client.post("/v2/rerank", json={"query": "invoices", "documents": benign, "lambda": 1.0},
                        headers=bearer(tenant))
        assert r.status_code == 200, r.text
        # admission charged what it charged before span scoring: the request's token, then
        # the 2 documents and the 2 passages the classifier embeds; no reservation
        assert charges == [1.0, round(s.rate_cost_per_document * 2 + s.rate_cost_per_embedding * 2, 6)]
        assert debits == []  # no document was doubtful: no span embedded, none charged
        expected = 200 - 1 - s.rate_cost_per_document * 2 - s.rate_cost_per_embedding * 2
        assert app.state.limits.tenant_rate.level(tenant) == pytest.approx(expected, abs=0.1)


def test_v2_fifty_long_documents_are_not_refused_for_their_spans(settings, embedder, spanning):
    doubtful, benign, n_spans = _span_fixtures(embedder, n_doubtful=20)
    s = settings
    assert s.rerank_max_candidates == 50
    counting = TextCountingEmbedder(embedder)
    app = _spans_app(settings, counting, burst=300, budget_ms=120_000)  # 300: the default bucket's size
    tenant = uuid.uuid4()
    docs = doubtful + [benign[i % 2] + f" Item {i}." for i in range(30)]
    assert len(docs) == 50
    with TestClient(app) as client:
        h = bearer(tenant)
        bucket = app.state.limits.tenant_rate
        frozen = bucket.clock()
        bucket.clock = lambda: frozen  # no refill while the 50 documents are embedded: exact levels
        # a short request first: the bucket is no longer full (a full one lets any charge through)
        r = client.post("/v2/rerank", json={"query": "q", "documents": ["a", "b"], "lambda": 1.0}, headers=h)
        assert r.status_code == 200, r.text
        level, before = bucket.level(tenant), counting.passage_texts
        admission = 1 + s.rate_cost_per_document * 50 + s.rate_cost_per_embedding * 50
        assert admission < level < admission + s.rate_cost_per_embedding * 50 * 8  # a reservation would not fit
        r = client.post("/v2/rerank", json={"query": "summarise", "documents": docs, "lambda": 0.6}, headers=h)
        assert r.status_code == 200, r.text  # no 429 for spans
        spans = counting.passage_texts - before - 50
        assert spans == n_spans > 0
        # less than before by the admission charge and exactly the spans' cost: here a debt
        after = level - admission - s.rate_cost_per_embedding * spans
        assert after < 0
        assert bucket.level(tenant) == pytest.approx(after, abs=1e-6)
        # which the tenant's next request waits out
        r = client.post("/v2/rerank", json={"query": "q", "documents": ["a", "b"], "lambda": 1.0}, headers=h)
        assert r.status_code == 429 and r.json()["error"] == "rate_limited", r.text
        assert int(r.headers["retry-after"]) >= 60 * (1 - after)  # 1 token a minute


def test_v2_request_failing_after_the_guard_still_pays_its_spans(settings, embedder, spanning):
    doubtful, benign, n_spans = _span_fixtures(embedder)
    s = settings
    app = _spans_app(settings, embedder)
    _charges, debits = _spy_charges(app)
    tenant = uuid.uuid4()

    async def broken_score(*a, **k):
        raise RuntimeError("scoring broke after the guard")

    with TestClient(app, raise_server_exceptions=False) as client:
        app.state.pipeline.score = broken_score
        r = client.post("/v2/rerank", json={"query": "summarise", "documents": [doubtful[0], benign[0]], "lambda": 0.6},
                        headers=bearer(tenant))
        assert r.status_code == 500
        # the spans the guard embedded are charged all the same, once
        assert debits == [n_spans]
        expected = 200 - 1 - s.rate_cost_per_document * 2 - s.rate_cost_per_embedding * (2 + n_spans)
        assert app.state.limits.tenant_rate.level(tenant) == pytest.approx(expected, abs=0.1)
