"""The BM25 term blocks of a tenant (kb.term_blocks; retrieval/sql/term_blocks.sql):
per common word, its chunks by BM25 weight in levels, read by kb.search_lexical. Built by
``kb.refresh_term_blocks()``, kept valid between rebuilds by a trigger; searches are exact
with or without them, only faster with fresh ones.

Every function runs inside the caller's tenant transaction.
"""

from __future__ import annotations

from kb_rerank.core.settings import Settings

STATE = ("select coalesce((select n_chunks from kb.corpus_stats), 0),"
         " exists (select from kb.term_blocks)")
REFRESH = "select kb.refresh_term_blocks(%s, %s, %s, %s)"


async def state(conn) -> tuple[int, bool]:
    """(the tenant's chunk count, whether it has term blocks)."""
    n_chunks, has_blocks = await (await conn.execute(STATE)).fetchone()
    return n_chunks, has_blocks


async def refresh(conn, settings: Settings) -> int:
    """Rebuild the tenant's term blocks with the configured level-0 length, minimum document
    frequency and BM25 parameters; returns the number of words with blocks."""
    cur = await conn.execute(
        REFRESH, [settings.term_list_length, settings.term_list_min_df, settings.bm25_k1, settings.bm25_b])
    return (await cur.fetchone())[0]
