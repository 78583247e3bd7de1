"""The request path without HTTP (no Litestar import): query normalisation and hashing, the
flow runner (single flight, cache read, audit, cache write: :mod:`.flow`), scoring with the
pair cache and fallback, guard policy, diversification, prompt assembly, and one module per
endpoint flow (:mod:`.rerank`, :mod:`.context`, :mod:`.caller_documents`)."""
