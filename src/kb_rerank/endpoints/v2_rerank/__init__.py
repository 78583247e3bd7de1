"""``POST /v2/rerank`` (Cohere v2 shape)."""
