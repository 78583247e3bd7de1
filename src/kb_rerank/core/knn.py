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
measures both paths at 0 / 50 / 10 / 1 % of 10k and 100k chunks. A clearly broad filter
(the SEMANTIC_WALK_* constants below) walks the graph without listing its documents first.
"""

from __future__ import annotations

SEMANTIC_EXACT_MAX_CHUNKS = 20000

# A clearly broad filter skips listing its documents: the graph walk checks each chunk it
# visits against that chunk's document. "Clearly broad" is judged on a sample of the tenant's
# chunks (SEMANTIC_WALK_SAMPLE of them, from a point of the random chunk ids set by the query):
# the share that passes the filter at least SEMANTIC_WALK_MIN_SHARE and that share of the
# tenant's chunks at least SEMANTIC_WALK_MIN_CHUNKS. The margin: a filter at the exact
# threshold (true share p = SEMANTIC_EXACT_MAX_CHUNKS / tenant chunks) is taken for broad only
# when its sample shows at least twice its share and at least a quarter: for a binomial of 256
# draws that is 6 or more standard deviations off at every tenant size (p = 1/8: 64 hits
# where 32 +- 5.3 are expected; p = 1/4: 128 where 64 +- 6.9; p = 1/2: all 256), at most
# 4e-8 by the exact binomial tail (its worst case: a 160k-chunk tenant). A quarter of the
# sample is read first and a filter failing it stops there (cheaper for narrow filters; it
# never makes the broad path likelier). A filter taken for broad walks the graph as any filter
# above the threshold does (recall@60 0.996 at 50 % of 100k chunks:
# bench/results/semantic-filter-speed-walk.md).
SEMANTIC_WALK_MIN_CHUNKS = 2 * SEMANTIC_EXACT_MAX_CHUNKS
SEMANTIC_WALK_MIN_SHARE = 0.25
SEMANTIC_WALK_SAMPLE = 256


def sql_constants() -> dict[str, str]:
    """The placeholders of the SQL layer that carry this module's constants, as SQL text."""
    return {"{{semantic_exact_max_chunks}}": str(SEMANTIC_EXACT_MAX_CHUNKS),
            "{{semantic_walk_min_chunks}}": str(SEMANTIC_WALK_MIN_CHUNKS),
            "{{semantic_walk_min_share}}": repr(SEMANTIC_WALK_MIN_SHARE),
            "{{semantic_walk_sample}}": str(SEMANTIC_WALK_SAMPLE)}
