"""The semantic list's choice of path, rendered into kb.search_semantic_ids
(retrieval/sql/search_semantic_ids.sql) as ``{{semantic_exact_max_chunks}}``.

A filter whose documents hold at most :data:`SEMANTIC_EXACT_MAX_CHUNKS` chunks is searched
exactly (the distance of each of its chunks, read from the covering index
chunks_tenant_doc_vectors_idx in an index-only scan); a broader one walks the HNSW graph with
the filter applied during the iterative scan. The graph walk kept recall@60 at 0.86 for a
filter of 10 % of a 100k-chunk tenant and 0.93 for 50 % of a 10k-chunk one, and neither a
wider candidate list (ef_search 200-1000: 0.86-0.91), more scan memory
(hnsw.scan_mem_multiplier 2-16) nor more tuples (hnsw.max_scan_tuples) lifted it to 0.95;
from 50k chunks in the filter on it kept 0.99. bench/results/semantic-exact-threshold.md
measures both paths at 0 / 50 / 10 / 1 % of 10k and 100k chunks.
"""

from __future__ import annotations

SEMANTIC_EXACT_MAX_CHUNKS = 20000


def sql_constants() -> dict[str, str]:
    """The placeholders of the SQL layer that carry this module's constants, as SQL text."""
    return {"{{semantic_exact_max_chunks}}": str(SEMANTIC_EXACT_MAX_CHUNKS)}
