"""What one request costs the tenant, computed in one place from what its flow declares.

A flow declares two :class:`Work` figures (:class:`~kb_rerank.endpoints.runner.Flow`):

* ``admission``: work the request's body already tells, charged before the cache read and
  never given back (``/v2/rerank``'s documents, each priced with its pair, and the passages
  the guard and MMR will embed, one a scored document);
* ``miss``: the most a cache miss can do (query embeddings, pairs for the cross-encoder),
  reserved in one charge when the miss starts, before any of its work. What the miss did not
  use (pairs the pair cache held, a refused slot, a failure) is given back when the request
  ends.

A search filter's work is charged once its size is known, before it runs
(:meth:`Bill.filter`): its terms (each value of ``$eq`` / ``$in``, each range:
:func:`kb_rerank.filters.grammar.terms`) times the thousands of documents of the tenant it
can touch, at ``rate_cost_per_filter_kdoc`` (free while the tenant is alone, as the other
work-conserving prices); never given back (the filter ran).

Work beyond what was declared (the guard's spans and the further chunks of long caller
documents, known only once embedded) is debited after the fact when the request ends, never
refused: the bucket may go negative and the tenant's next requests wait the debt out
(:meth:`kb_rerank.core.limits.RateLimiter.debit`). Prices: ``rate_cost_per_document``,
``rate_cost_per_embedding``, and a pair's price measured from the model (``rate_cost_per_model_second``
times its calibrated seconds per pair, at least ``rate_cost_per_pair``:
:attr:`kb_rerank.core.limits.Limits.cost_per_pair`) (docs/tuning.md, "Rate limits").
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, AsyncIterator

from kb_rerank.core.limits import REQUEST_COST, Limits, Prices


@dataclass(frozen=True)
class Work:
    documents: int = 0  # caller documents (each priced with its pair for the cross-encoder)
    embeddings: int = 0  # texts for the embedder
    pairs: int = 0  # (query, passage) pairs for the cross-encoder

    def price(self, prices: Prices | Limits) -> float:
        return (prices.cost_per_document * self.documents + prices.cost_per_embedding * self.embeddings
                + prices.cost_per_pair * self.pairs)


def filter_price(prices: Prices | Limits, terms: int, documents: int) -> float:
    """A search filter's price: its terms times the thousands of documents it can touch."""
    return prices.cost_per_filter_kdoc * terms * max(1.0, documents / 1000.0)


class Bill:
    """One request's account with its tenant's bucket: :meth:`admit`, :meth:`reserve`, the
    slots that consume what was paid, and :meth:`settle` once when the request ends."""

    def __init__(self, limits: Limits, tenant: Any) -> None:
        self.limits, self.tenant = limits, tenant
        # the request's prices, fixed when it starts: free while the tenant is alone
        # (work-conserving: kb_rerank.core.limits.Limits.prices)
        self.prices = limits.prices(tenant)
        # paid for and not used yet: at admission (kept) and reserved (given back unused)
        self._admitted = Work()
        self._reserved = Work()
        self._owed = 0  # embeddings done beyond what was paid
        self._slot: tuple[int, tuple[int, int, int]] = (0, (0, 0, 0))  # the last model slot's pairs
        self._settled = False
        self._paid = REQUEST_COST  # charged so far (the auth guard's token first): "a full bucket" is before it

    def admit(self, work: Work) -> None:
        """Before the cache read (429 when short): the work the body tells."""
        price = work.price(self.prices)
        self.limits.charge(self.tenant, price, paid=REQUEST_COST)
        self._paid += price
        # a document's price includes its pair
        self._admitted = Work(embeddings=self._admitted.embeddings + work.embeddings,
                              pairs=self._admitted.pairs + work.documents + work.pairs)

    def reserve(self, work: Work) -> None:
        """When a miss starts (429 when short): the most it can do, in one charge."""
        price = work.price(self.prices)
        self.limits.charge(self.tenant, price, paid=REQUEST_COST)
        self._paid += price
        self._reserved = Work(embeddings=self._reserved.embeddings + work.embeddings,
                              pairs=self._reserved.pairs + work.pairs)

    def _use(self, embeddings: int = 0, pairs: int = 0) -> tuple[int, int, int]:
        """Consume paid work, admitted first; embeddings beyond it are owed, pairs charged now.
        Returns where the pairs came from: (admitted, reserved, charged now)."""
        a, r = self._admitted, self._reserved
        ea = min(embeddings, a.embeddings)
        er = min(embeddings - ea, r.embeddings)
        pa = min(pairs, a.pairs)
        pr = min(pairs - pa, r.pairs)
        self._admitted = Work(embeddings=a.embeddings - ea, pairs=a.pairs - pa)
        self._reserved = Work(embeddings=r.embeddings - er, pairs=r.pairs - pr)
        self._owe(embeddings - ea - er)
        if pairs > pa + pr:
            self.limits.charge(self.tenant, self.prices.cost_per_pair * (pairs - pa - pr), paid=REQUEST_COST)
        return pa, pr, pairs - pa - pr

    def _owe(self, embeddings: int) -> None:
        if embeddings <= 0:
            return
        if self._settled:  # a late batch (the guard stopped waiting for it): charged as it runs
            self.limits.tenant_rate.debit(self.tenant, self.prices.cost_per_embedding * embeddings)
        else:
            self._owed += embeddings

    @contextlib.asynccontextmanager
    async def embedder(self, texts: int) -> AsyncIterator[None]:
        """One of the tenant's embedder slots for ``texts`` texts (429 ``tenant_busy`` when
        its cap holds); the texts are counted as used once the slot is held."""
        async with self.limits.embedder_slot(self.tenant):
            self._use(embeddings=texts)
            yield

    @contextlib.asynccontextmanager
    async def model(self, pairs: int) -> AsyncIterator[None]:
        """One of the tenant's model slots for ``pairs`` pairs; counted as used once held
        (:meth:`scored` corrects the count once the model says how many it scored)."""
        async with self.limits.model_slot(self.tenant):
            self._slot = (pairs, self._use(pairs=pairs))
            yield

    def scored(self, pairs: int) -> None:
        """The model scored ``pairs`` of the pairs its slot was paid for. Fewer (the budget
        ended first, or a failure): the rest go back where they came from (charged now:
        refunded; reserved: given back at :meth:`settle`; admitted: kept for later use). More
        (estimates are estimates): the extra is debited, never refused. A pair a
        ``/v2/rerank`` document paid for at the document's price is debited the difference
        when the measured pair price is higher."""
        expected, (pa, pr, pc) = self._slot
        self._slot = (0, (0, 0, 0))
        price = self.prices.cost_per_pair
        if pairs < expected:
            back = expected - pairs
            refund = min(back, pc)
            if refund:
                self.limits.tenant_rate.refund(self.tenant, price * refund)
            back -= refund
            to_reserved = min(back, pr)
            self._reserved = Work(embeddings=self._reserved.embeddings, pairs=self._reserved.pairs + to_reserved)
            back -= to_reserved
            pa -= min(back, pa)
            self._admitted = Work(embeddings=self._admitted.embeddings, pairs=self._admitted.pairs + back)
        elif pairs > expected:
            self.limits.tenant_rate.debit(self.tenant, price * (pairs - expected))
        excess = price - self.prices.cost_per_document
        if pa > 0 and excess > 0:
            self.limits.tenant_rate.debit(self.tenant, excess * min(pa, pairs))

    def filter(self, terms: int, documents: int) -> None:
        """Before a search filter runs (429 when short): ``terms`` terms over ``documents``
        documents, kept (the filter runs once paid)."""
        price = filter_price(self.prices, terms, documents)
        self.limits.charge(self.tenant, price, paid=self._paid)
        self._paid += price

    def unrun(self, embeddings: int) -> None:
        """``embeddings`` counted when their slot was held never ran (the request was abandoned
        before their units started): not charged (given back at :meth:`settle`)."""
        if self._settled or embeddings <= 0:
            return
        owed = min(embeddings, self._owed)
        self._owed -= owed
        self._reserved = Work(embeddings=self._reserved.embeddings + embeddings - owed,
                              pairs=self._reserved.pairs)

    def settle(self) -> None:
        """Once, when the request ends however it ends: the unused reservation back, the
        owed embeddings debited."""
        if self._settled:
            return
        self._settled = True
        unused, self._reserved = self._reserved.price(self.prices), Work()
        if unused > 0:
            self.limits.tenant_rate.refund(self.tenant, unused)
        owed, self._owed = self._owed, 0
        if owed:
            self.limits.tenant_rate.debit(self.tenant, self.prices.cost_per_embedding * owed)
