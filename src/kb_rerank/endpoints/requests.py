"""The typed inputs of the three flows (msgspec Structs): the HTTP layer decodes each JSON
body into one of them (:mod:`kb_rerank.http.body`), its OpenAPI document is generated from
them, and SQL-free callers (tests, benchmarks) build them directly. Bounds live in the
types, so a value out of range is a 422 naming its field before any work."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from kb_rerank.core.settings import SOURCES


Source = Literal[SOURCES]  # the sources, in their documented order (settings.SOURCES)


DEFAULT_SOURCE = SOURCES[0]


PosInt = Annotated[int, msgspec.Meta(ge=1)]


# A search filter (kb_rerank.filters.grammar, docs/filters.md): an object of fields; its
# grammar is checked by kb_rerank.endpoints.parse (a 422 naming the field), which replaces it by
# its canonical form.
Filter = Annotated[dict[str, Any], msgspec.Meta(description=(
    "Metadata filter (docs/filters.md): every field must match. A field is a front-matter key or"
    " source_path, language, title, updated_at; a value is equality (a list matches when it holds it),"
    " {\"$in\": [...]} or a range {\"$gte\"|\"$gt\": a, \"$lte\"|\"$lt\": b} on numbers or ISO 8601 dates."
    " Applied inside both candidate lists before fusion; a bad filter is a 422 naming the field."))]


# The query's language, named by the caller (kb_rerank.endpoints.parse normalises it: 'de', 'pt-BR',
# 'German'; a 422 naming the field when unknown); detected from the query when absent.
Language = Annotated[str, msgspec.Meta(description=(
    "The query's language (ISO 639-1 'de', a tag 'pt-BR', or an English name 'German'): its words are"
    " analysed in that language when the knowledge base holds documents in it. Absent: detected from"
    " the query, else the knowledge base's languages."))]


class RerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    source: Source = DEFAULT_SOURCE
    # results, 1..KB_MAX_TOP_N (20); default KB_RERANK_TOP_N (10) (kb_rerank.endpoints.parse.check_top_n)
    top_n: Annotated[int, msgspec.Meta(ge=1, description="Results returned, 1..20 (KB_MAX_TOP_N; default 10)")] | None = None
    filter: Filter | None = None
    language: Language | None = None


Lambda = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


# Caller-supplied numbers that enter the composite score are bounded, so no arithmetic on them
# overflows to inf/NaN (a recency weight of 1.6e308 did: a 500 found by the schema fuzzer).
Weight = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]  # relevance is in 0..1: 100 already swamps it


HalfLife = Annotated[float, msgspec.Meta(gt=0.0, le=36500.0)]  # days: at most 100 years


Authority = Annotated[float, msgspec.Meta(ge=0.0, le=1e6)]  # enters as a / (1 + a)


CallerScore = Annotated[float, msgspec.Meta(ge=-1e12, le=1e12)]  # finite; only ranks are used


class ContextRequest(msgspec.Struct, forbid_unknown_fields=True, rename={"lam": "lambda"}):
    query: str
    top_n: PosInt | None = None
    lam: Lambda | None = None
    recency_weight: Weight = 0.0
    half_life_days: HalfLife = 30.0
    authority_weight: Weight = 0.0
    explain: bool = False
    filter: Filter | None = None
    language: Language | None = None


class V2Scores(msgspec.Struct, forbid_unknown_fields=True):
    bm25: CallerScore | None = None
    cosine: CallerScore | None = None


class V2Metadata(msgspec.Struct, forbid_unknown_fields=True):
    source: str | None = None
    authority: Authority | None = None
    updated_at: datetime | None = None


class V2Document(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    id: str | None = None
    scores: V2Scores | None = None
    metadata: V2Metadata | None = None


class V2Request(msgspec.Struct, forbid_unknown_fields=True, rename={"lam": "lambda"}):
    query: str
    documents: list[str | V2Document]
    model: str | None = None
    top_n: PosInt | None = None
    max_tokens_per_doc: PosInt | None = None
    return_documents: bool = False
    lam: Lambda | None = None
    recency_weight: Weight = 0.0
    half_life_days: HalfLife = 30.0
    authority_weight: Weight = 0.0
    explain: bool = False
    # the guard over caller documents: "apply" excludes documents with strong evidence of prompt
    # injection (the one departure from Cohere's contract) and demotes doubtful ones; "report"
    # only reports them in meta.filtered
    guard: Literal["apply", "report"] = "apply"
