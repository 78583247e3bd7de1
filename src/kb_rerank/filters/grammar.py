"""The search filter of ``/v1/kb/search/rerank``, ``/v1/kb/context`` and the SQL searches
(``filter jsonb``): its grammar checked before any work, and its canonical form, the one the
database checks again (kb.search_filter, sql/functions/09_search_filter.sql) and the cache
key includes. docs/filters.md is the grammar; tests/filters/test_filters.py runs one table of bad
filters through this module (the REST 422) and through kb.search_filter (SQLSTATE 22023),
each naming the same field.

A filter is a JSON object of at most :data:`MAX_FIELDS` fields, all of which must match:
``"f": v`` (equality; a list value of the document matches when it holds v), ``{"$eq": v}``
(the same), ``{"$in": [v, ...]}`` (1..100 values), ``{"$gte"|"$gt": a, "$lte"|"$lt": b}`` (a
range on numbers or on ISO 8601 dates). Fields are front-matter keys (kb.documents.metadata)
and the reserved :data:`RESERVED` read from the document's columns.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any

MAX_FIELDS = 16
MAX_IN = 100
MAX_STRING = 256
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
# the dates kb.search_filter_time accepts (the same pattern)
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?")
# columns of kb.documents: source_path is source_uri; strings, except updated_at (a date)
RESERVED = ("source_path", "language", "title", "updated_at")
STRING_FIELDS = ("source_path", "language", "title")
OPERATORS = ("$eq", "$in", "$gte", "$gt", "$lte", "$lt")
BOUNDS = ("$gte", "$gt", "$lte", "$lt")


class FilterError(ValueError):
    """A filter outside the grammar: ``field`` is the offending path (``filter.product``,
    ``filter.updated_at.$gte``), the 422's ``field``."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field, self.detail = field, detail


def utc_time(value: str, field: str) -> str:
    """An ISO 8601 date or time as kb.search_filter_time writes it (UTC, microseconds)."""
    if not ISO_DATE.fullmatch(value):
        raise FilterError(field, f"not an ISO 8601 date or time: {value[:64]}")
    try:
        t = datetime.fromisoformat(value.replace(" ", "T", 1))
    except ValueError:
        raise FilterError(field, f"not a valid date or time: {value[:64]}") from None
    t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "+00:00"


def _scalar(v: Any, where: str, field: str) -> Any:
    if isinstance(v, bool) or isinstance(v, str) or (isinstance(v, (int, float)) and math.isfinite(v)):
        if isinstance(v, str) and len(v) > MAX_STRING:
            raise FilterError(where, f"a string of at most {MAX_STRING} characters")
        if field in RESERVED and not isinstance(v, str):
            raise FilterError(where, f"{field} takes strings")
        return utc_time(v, where) if field == "updated_at" else v
    kind = "null" if v is None else "array" if isinstance(v, list) else "object" if isinstance(v, dict) \
        else type(v).__name__
    raise FilterError(where, f"a value is a string, a number or a boolean, got {kind}")


def _range(cond: dict[str, Any], path: str, field: str) -> dict[str, Any]:
    if field in STRING_FIELDS:
        raise FilterError(path, f"{field} takes equality or $in, not a range")
    if ("$gte" in cond and "$gt" in cond) or ("$lte" in cond and "$lt" in cond):
        raise FilterError(path, "one lower bound ($gte or $gt) and one upper bound ($lte or $lt) at most")
    out: dict[str, Any] = {}
    kinds = set()
    for op in sorted(cond):
        v, where = cond[op], f"{path}.{op}"
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and field != "updated_at":
            kinds.add("number")
        elif isinstance(v, str) and len(v) <= MAX_STRING:
            kinds.add("time")
            v = utc_time(v, where)
        else:
            what = "an ISO 8601 date or time" if field == "updated_at" else "a number or an ISO 8601 date or time"
            raise FilterError(where, f"a bound is {what}")
        if len(kinds) > 1:
            raise FilterError(path, "both bounds are numbers or both are dates")
        out[op] = v
    return out


def canonical(filter: Any) -> dict[str, Any] | None:
    """``filter`` checked and in canonical form (kb.search_filter's): ``{"f": {"$in": [...]}}``
    for equality and $in, ``{"f": {"$gte": a, ...}}`` for a range, dates as UTC text, fields
    in sorted order; None for no filter (None or ``{}``). Raises :class:`FilterError`."""
    if filter is None or filter == {}:
        return None
    if not isinstance(filter, dict):
        raise FilterError("filter", "a filter is a JSON object of fields")
    if len(filter) > MAX_FIELDS:
        raise FilterError("filter", f"at most {MAX_FIELDS} fields")
    out: dict[str, Any] = {}
    for field in sorted(filter):
        if not isinstance(field, str) or not FIELD_NAME.fullmatch(field):
            raise FilterError("filter", f"field names match ^[A-Za-z_][A-Za-z0-9_.-]{{0,63}}$, got {str(field)[:80]}")
        path, cond = f"filter.{field}", filter[field]
        if not isinstance(cond, dict):
            cond = {"$eq": cond}
        if not cond:
            raise FilterError(path, "an empty condition")
        for op in cond:
            if op not in OPERATORS:
                raise FilterError(f"{path}.{op[:40]}", f"unknown operator {op[:40]} (use {', '.join(OPERATORS)})")
        if "$eq" in cond or "$in" in cond:
            if len(cond) > 1:
                raise FilterError(path, "$eq and $in stand alone")
            if "$in" in cond:
                path, values = f"{path}.$in", cond["$in"]
                if not isinstance(values, list) or not 1 <= len(values) <= MAX_IN:
                    raise FilterError(path, f"a list of 1 to {MAX_IN} values")
            else:
                values = [cond["$eq"]]
            out[field] = {"$in": [_scalar(v, path, field) for v in values]}
        else:
            out[field] = _range(cond, path, field)
    return out
