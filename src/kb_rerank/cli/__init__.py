"""The ``kb-rerank`` command line."""
