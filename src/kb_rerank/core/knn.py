"""The semantic list's choice of path, rendered into kb.search_semantic_ids
(retrieval/sql/search_semantic_ids.sql) as ``{{semantic_exact_max_chunks}}``.

A filter whose documents hold at most :data:`SEMANTIC_EXACT_MAX_CHUNKS` chunks is searched
exactly (the distance of each of its chunks, read through the (tenant_id, doc_id) index);
a broader one walks the HNSW graph with the filter applied during the iterative scan. The
graph walk kept recall@60 at 0.85 for a filter of 10 % of a 100k-chunk tenant and 0.93 for
50 % of a 10k-chunk one, and a wider candidate list (ef_search 200-800) did not lift it; from
50k chunks in the filter on it kept 0.99. The exact search's cost grows with the filter's
chunks (each vector is read from TOAST): bench/results/semantic-exact-threshold.md measures
both paths at 0 / 50 / 10 / 1 % of 10k and 100k chunks.
"""

from __future__ import annotations

SEMANTIC_EXACT_MAX_CHUNKS = 20000


def sql_constants() -> dict[str, str]:
    """The placeholders of the SQL layer that carry this module's constants, as SQL text."""
    return {"{{semantic_exact_max_chunks}}": str(SEMANTIC_EXACT_MAX_CHUNKS)}
