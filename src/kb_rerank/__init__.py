"""kb-rerank: Postgres hybrid search (BM25 + pgvector, RRF in SQL) and cross-encoder rerank."""

__version__ = "0.1.0"
