"""Which candidates leave the database, written once for the service, ``kb-rerank search``
and ``kb-rerank eval`` (:class:`RetrievalSpec`), and the read itself (:func:`read`: one tenant
transaction, on a standby or the primary, chosen by the runner).

Candidate counts: ``hybrid_lexical_semantic`` fuses the lexical and semantic lists
``fusion_depth`` deep and keeps the best 2 x ``candidates`` (kb.retrieve_hybrid: kb.search_hybrid's
rows, with their pair scores when asked for, in one statement);
``lexical_only`` (kb.search_lexical, BM25 ``bm25_k1`` / ``bm25_b``) and ``semantic_only``
(kb.search_semantic) keep ``candidates``; ``manual_curation`` reads the query's curated list,
at most ``rerank_top_n``. Rows are deduplicated by chunk. ``filter`` (a canonical search
filter, kb_rerank.filters.grammar) is applied inside each list, and to the curated list.

The query's language (``language``, named by the caller) is guessed here when not named
(kb_rerank.core.language.guess_query_language: a millisecond's work, on the query alone; a
named language always wins) and, by :meth:`RetrievalSpec.query_language`, a sure guess is
passed to the lexical search, a weak one only when the tenant's own languages for the query
leave it out (why: kb_rerank.core.language's docstring). The search analyses the query's
words in the language it is given only when the tenant holds documents in it
(kb.query_languages(query, tenant, language)), else as the tenant's languages choose.
Detection runs in Python because the detector is a Python model; a SQL caller passes the
language or leaves the choice to the tenant's languages, as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from kb_rerank.core.candidate import Candidate
from kb_rerank.core.language import guess_query_language
from kb_rerank.core.settings import Settings
from kb_rerank.rerank import pair_cache
from kb_rerank.db import replicas
from kb_rerank.retrieval import store as search

HYBRID, LEXICAL, SEMANTIC, CURATED = "hybrid_lexical_semantic", "lexical_only", "semantic_only", "manual_curation"


@dataclass(frozen=True)
class RetrievalSpec:
    source: str
    limit: int  # candidates that leave the database
    depth: int  # hybrid: how deep each list is read before fusion; else = limit
    fusion: Mapping[str, Any]  # kb.search_hybrid's fusion arguments (Settings.fusion)
    bm25_k1: float
    bm25_b: float
    details: bool = False  # the chunks' stored guard flags, embeddings and document metadata too
    filter: Mapping[str, Any] | None = None  # canonical search filter; None: none
    language: str | None = None  # the query's language, named (ISO 639-1); None: detected

    @classmethod
    def of(cls, settings: Settings, source: str, *, candidates: int | None = None,
           details: bool = False, filter: Mapping[str, Any] | None = None,
           language: str | None = None) -> "RetrievalSpec":
        """The service's candidates for ``source`` (``candidates``: instead of KB_CANDIDATES)."""
        cand = int(candidates or settings.candidates)
        if source == HYBRID:
            limit, depth = 2 * cand, settings.fusion_depth
        elif source in (LEXICAL, SEMANTIC):
            limit = depth = cand
        elif source == CURATED:
            limit = depth = settings.max_top_n
        else:
            raise ValueError(f"unknown source {source!r}")
        return cls(source, limit, depth, dict(settings.fusion), settings.bm25_k1, settings.bm25_b, details, filter,
                   language)

    def deeper(self, depth: int) -> "RetrievalSpec":
        """The same search read ``depth`` deep, every fused row kept (the eval's recall)."""
        return dataclasses.replace(self, depth=max(self.depth, depth), limit=max(self.limit, 2 * depth))

    async def query_language(self, conn, query: str) -> str | None:
        """The language the lexical search is given (in ``conn``'s tenant transaction): the
        named one; else a sure guess; else a weak guess the tenant's own languages for the
        query leave out (one statement, only for a weak guess); else None."""
        if self.language:
            return self.language
        guess = guess_query_language(query)
        if guess is None or guess.sure:
            return guess and guess.language
        return await search.aweak_guess(conn, query, guess.language)

    async def lexical_list(self, conn, query: str) -> "LexicalList":
        """A hybrid read's lexical list alone, in ``conn``'s tenant transaction, with the
        language decision it was read under (:meth:`query_language`): what :meth:`fetch`
        takes as ``lexical`` to fuse instead of reading it (the same rows)."""
        assert self.source == HYBRID
        language = await self.query_language(conn, query)
        ids = await search.alexical_list(conn, query, self.depth, k1=self.bm25_k1, b=self.bm25_b,
                                         filter=self.filter, language=language)
        return LexicalList(language, ids)

    @property
    def needs_embedding(self) -> bool:
        return self.source in (HYBRID, SEMANTIC)

    async def fetch(self, conn, query: str, embedding: Any, *, query_hash: str | None = None,
                    pairs: tuple[str, str] | None = None, generation: int = 0,
                    lexical: "LexicalList | None" = None) -> "Fetched":
        """The candidates, in ``conn``'s tenant transaction (``query_hash``: the curated list's
        key); with ``pairs`` (the model and the query's pair hash), also their live pair scores
        under ``generation`` (``.pair_scores``; None without ``pairs`` or without candidates).
        Hybrid: one statement for both (kb.retrieve_hybrid, the same rows as kb.search_hybrid's
        first ``limit``); the other sources read the pair scores with a second statement.
        ``lexical`` (hybrid): the lexical list :meth:`lexical_list` read for this query, fused
        instead of read again."""
        cached = None
        if self.source == HYBRID:
            language = lexical.language if lexical is not None else await self.query_language(conn, query)
            rows, cached = await search.aretrieve_hybrid(conn, query, embedding, self.depth, **self.fusion,
                                                         limit=self.limit, pairs=pairs, generation=generation,
                                                         filter=self.filter, language=language,
                                                         lexical=lexical.ids if lexical is not None else None)
        elif self.source == LEXICAL:
            rows = await search.alexical(conn, query, self.limit, k1=self.bm25_k1, b=self.bm25_b, filter=self.filter,
                                         language=await self.query_language(conn, query))
        elif self.source == SEMANTIC:
            rows = await search.asemantic(conn, embedding, self.limit, filter=self.filter)
        else:
            rows = await search.acurated(conn, query_hash or "", self.limit, filter=self.filter)
        seen: set = set()
        unique = Fetched(c for c in rows if not (c.id in seen or seen.add(c.id)))
        if self.details:
            await search.adetails(conn, unique)
        if pairs is not None and self.source != HYBRID and unique:
            cached = await pair_cache.get_live(conn, pairs[0], pairs[1], pair_keys(unique), generation=generation)
        unique.pair_scores = cached if unique else None
        return unique


@dataclass(frozen=True)
class LexicalList:
    """:meth:`RetrievalSpec.lexical_list`: the language decision and the list (chunk ids,
    document ids, scores, in rank order)."""

    language: str | None
    ids: tuple[list, list, list]


class Fetched(list):
    """:meth:`RetrievalSpec.fetch`'s candidates (a list, in order) and ``pair_scores``: their
    live pair scores as :func:`kb_rerank.rerank.pair_cache.get_live` returns them, or None when
    none were asked for."""

    pair_scores: dict | None = None


def pair_keys(cands: list[Candidate]) -> list[pair_cache.PairKey]:
    """Each candidate's pair-cache key (its chunk, or none for a caller document, and its text)."""
    return [pair_cache.content_key(c.chunk_id, c.content) for c in cands]


async def read(conn, spec: RetrievalSpec, query: str, embedding: Any, *, generation: int, on_primary: bool,
               query_hash: str, pairs: tuple[str, str] | None,
               lexical: LexicalList | None = None) -> tuple[list[Candidate], dict | None]:
    """One read-only tenant transaction (already open on ``conn``): on a standby, first that it
    has replayed ``generation`` (the answer is cached under it); the candidates; on the
    primary, their live pair scores in the same transaction (``pairs``: the model and the
    query's pair hash; None: not read), for hybrid retrieval in the same statement.
    ``lexical``: the hybrid read's lexical list, already read (:meth:`RetrievalSpec.fetch`)."""
    await _check_replayed(conn, generation, on_primary)
    cands = await spec.fetch(conn, query, embedding, query_hash=query_hash,
                             pairs=pairs if on_primary else None, generation=generation, lexical=lexical)
    return cands, cands.pair_scores


async def read_lexical(conn, spec: RetrievalSpec, query: str, *, generation: int, on_primary: bool) -> LexicalList:
    """The hybrid read's lexical list in a read-only tenant transaction of its own (already
    open on ``conn``), checked on a standby as :func:`read` checks it: the runner reads it while
    the query is being embedded and gives it to :func:`read`."""
    await _check_replayed(conn, generation, on_primary)
    return await spec.lexical_list(conn, query)


async def _check_replayed(conn, generation: int, on_primary: bool) -> None:
    """On a standby, :class:`replicas.StandbyBehind` unless it has replayed ``generation``."""
    if not on_primary and await replicas.replayed_generation(conn) < generation:
        raise replicas.StandbyBehind
