"""Helpers for tests and benchmarks (a tiny offline cross-encoder). The runtime never
imports this package (tests/test_packaging.py checks it); it needs the ``[rerank]`` extra."""
