"""``POST /v1/kb/search/rerank``."""
