"""The query as the cache, the audit and the pair cache know it.

``normalize_query``: Unicode NFC, strip, collapse every run of (Unicode) whitespace to
one space. Nothing else: case, accents and punctuation are kept (``ERR_402`` and
``err_402`` are different keys; lexical search folds case and accents itself). The
normalised query is what is searched and reranked.

``query_hash`` = HMAC-SHA256 hex, under the server's query-hash key (``KB_QUERY_HASH_KEY``,
else ``<data_dir>/keys/query_hash.key``: :mod:`kb_rerank.core.keys`), of the UTF-8 of the
normalised query (and, for keys that depend on more than the query, ``\\x1f`` + the
canonical JSON of those parameters): the one function behind every stored query hash
(audit, cache, pair scores, curation), so a stored hash cannot be matched by hashing
guesses without the key. The key is read once per app (start), not per request. The
plaintext query is never stored or logged, only its hash.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import unicodedata
from typing import Any, Mapping

from kb_rerank.core.keys import server_key
from kb_rerank.core.settings import Settings


def normalize_query(query: str) -> str:
    """NFC, strip, collapse internal whitespace. Nothing else."""
    return " ".join(unicodedata.normalize("NFC", query).split())


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def query_hash_key(settings: Settings) -> bytes:
    """The server's query-hash key: ``KB_QUERY_HASH_KEY``, else the key file under data_dir
    (created on first use). Read it once (the service does, at app start) and pass it on."""
    return server_key(settings, "query_hash", settings.query_hash_key)


def query_hash(normalized: str, key: bytes, params: Mapping[str, Any] | None = None) -> str:
    """THE hash of a query, for every stored row that names one (audit, cache, pair scores,
    curation): HMAC-SHA256 hex under ``key`` (:func:`query_hash_key`) of the UTF-8 of the
    normalised query, followed, when ``params`` is given, by ``\\x1f`` and the canonical JSON
    of the parameters that change a result (the cache key of /v1/kb/context and /v2/rerank).
    ``\\x1f`` never occurs in a normalised query (it is whitespace to ``str.split``), so the
    two forms cannot collide."""
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise TypeError("query_hash needs the server's query-hash key (bytes)")
    msg = normalized if params is None else normalized + "\x1f" + canonical_json(params)
    return hmac.new(bytes(key), msg.encode("utf-8"), hashlib.sha256).hexdigest()
