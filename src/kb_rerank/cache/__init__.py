"""The answer cache (kb.kb_rerank_cache) and its eviction."""
