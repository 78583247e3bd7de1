"""kb-rerank: Postgres hybrid search (BM25 + pgvector, fused in SQL) and cross-encoder rerank."""

from importlib.metadata import PackageNotFoundError, version as _installed_version

try:  # one source of the version: pyproject.toml, as installed
    __version__ = _installed_version("kb-rerank")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
