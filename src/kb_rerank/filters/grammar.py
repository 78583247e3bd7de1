"""The search filter of ``/v1/kb/search/rerank``, ``/v1/kb/context`` and the SQL searches
(``filter jsonb``): its grammar checked before any work, and its canonical form, the one the
database checks again (kb.search_filter, filters/sql/search_filter.sql) and the cache
key includes. docs/filters.md is the grammar. The limits and patterns here are the SQL
twin's too: :func:`sql_constants` renders them into the idempotent layer, and
tests/filters/test_filter_parity.py runs one table of filters through this module (the REST 422)
and through kb.search_filter (SQLSTATE 22023): the same accept or refuse, the same field,
the same words, the same canonical form.

A filter is a JSON object of at most :data:`MAX_FIELDS` fields, all of which must match:
``"f": v`` (equality; a list value of the document matches when it holds v), ``{"$eq": v}``
(the same), ``{"$in": [v, ...]}`` (1..100 values), ``{"$gte"|"$gt": a, "$lte"|"$lt": b}`` (a
range on numbers or on ISO 8601 dates). Numbers are doubles (finite, at most 1e308 in
magnitude, an integer of at most 40 significant digits), dates lie within years 1 to 9999
in UTC, a language is normalised as ingestion normalises it. Fields are front-matter keys (kb.documents.metadata)
and the reserved :data:`RESERVED` read from the document's columns.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from typing import Any

from kb_rerank.core.language import ACCEPTED_LANGUAGES, language_aliases, normalize_language_code

MAX_FIELDS = 16
MAX_IN = 100
MAX_STRING = 256
# numbers: finite doubles of at most this magnitude, written with at most MAX_DIGITS
# significant digits; read as doubles (a decimal under 1e-330 in magnitude reads as 0)
MAX_NUMBER = 1e308
MAX_DIGITS = 40
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
# the dates kb.search_filter_time accepts (the same pattern)
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?")
# a language tag whose primary subtag is kept when the code is not one normalize_language_code knows
LANGUAGE_TAG = re.compile(r"[a-z]{2,3}(-[a-z0-9]{1,8})*")
# columns of kb.documents: source_path is source_uri; strings, except updated_at and
# ingested_at (dates)
RESERVED = ("source_path", "language", "title", "updated_at", "ingested_at")
STRING_FIELDS = ("source_path", "language", "title")
DATE_FIELDS = ("updated_at", "ingested_at")
OPERATORS = ("$eq", "$in", "$gte", "$gt", "$lte", "$lt")
BOUNDS = ("$gte", "$gt", "$lte", "$lt")
_FIELD_RULE = ("a field name is a letter or an underscore, then at most 63 letters, digits, underscores,"
               " dots or hyphens")


class FilterError(ValueError):
    """A filter outside the grammar: ``field`` is the offending path (``filter.product``,
    ``filter.updated_at.$gte``), the 422's ``field``."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field, self.detail = field, detail


def _sql_text(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def sql_constants() -> dict[str, str]:
    """The placeholders of the idempotent SQL layer that carry this grammar's limits, each
    as SQL text (sqlfiles.render fills them): kb.search_filter reads these, not literals."""
    return {
        "{{filter_max_fields}}": str(MAX_FIELDS),
        "{{filter_max_in}}": str(MAX_IN),
        "{{filter_max_string}}": str(MAX_STRING),
        "{{filter_max_number}}": repr(MAX_NUMBER),
        "{{filter_max_digits}}": str(MAX_DIGITS),
        "{{filter_field_name}}": _sql_text("^" + FIELD_NAME.pattern + "$"),
        "{{filter_field_rule}}": _sql_text(_FIELD_RULE),
        "{{filter_iso_date}}": _sql_text("^" + ISO_DATE.pattern + "$"),
        "{{filter_language_tag}}": _sql_text("^" + LANGUAGE_TAG.pattern + "$"),
        "{{filter_language_aliases}}": _sql_text(json.dumps(language_aliases(), sort_keys=True)) + "::jsonb",
        "{{filter_language_accepted}}": _sql_text(ACCEPTED_LANGUAGES),
        "{{filter_operators}}": _sql_text(", ".join(OPERATORS)),
    }


def utc_time(value: str, field: str) -> str:
    """An ISO 8601 date or time as kb.search_filter_time writes it (UTC, microseconds),
    within years 1 to 9999 in UTC."""
    if not ISO_DATE.fullmatch(value):
        raise FilterError(field, f"not an ISO 8601 date or time: {value[:64]}")
    try:
        t = datetime.fromisoformat(value.replace(" ", "T", 1))
        t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise FilterError(field, f"not a valid date or time between years 1 and 9999 in UTC: {value[:64]}") from None
    return t.isoformat(timespec="microseconds")


def number(v: int | float, where: str) -> int | float:
    """A filter's number as both languages read it: a finite double of magnitude at most
    MAX_NUMBER, written with at most MAX_DIGITS significant digits; an integral value within
    2**53 stays an integer."""
    if isinstance(v, float) and not math.isfinite(v) or abs(v) > MAX_NUMBER:
        raise FilterError(where, f"a number is finite and at most {MAX_NUMBER:g} in magnitude")
    if isinstance(v, int) and len(str(abs(v)).strip("0")) > MAX_DIGITS:
        raise FilterError(where, f"a number has at most {MAX_DIGITS} significant digits")
    f = float(v)
    return int(f) if f.is_integer() and abs(f) <= 2 ** 53 else f


def language(value: str, where: str) -> str:
    """A language as kb.documents.language holds it: normalised as ingestion normalises a
    front-matter language ('JA', 'ja-JP', 'jpn', 'Japanese' -> 'ja'); a well-formed tag not
    known there by its primary subtag, lower-cased; anything else refused."""
    try:
        return normalize_language_code(value)
    except ValueError:
        tag = value.strip().lower().replace("_", "-")
        if len(tag) <= 35 and LANGUAGE_TAG.fullmatch(tag):
            return tag.split("-", 1)[0]
        raise FilterError(where, f"not a language code: {value[:64]} ({ACCEPTED_LANGUAGES})") from None


def _kind(v: Any) -> str:
    """A value's JSON type, as jsonb_typeof names it."""
    return ("null" if v is None else "array" if isinstance(v, list) else "object" if isinstance(v, dict)
            else "boolean" if isinstance(v, bool) else "string" if isinstance(v, str) else "number")


def _scalar(v: Any, where: str, field: str) -> Any:
    if not (isinstance(v, (bool, str, int, float))):
        raise FilterError(where, f"a value is a string, a number or a boolean, got {_kind(v)}")
    if isinstance(v, str) and len(v) > MAX_STRING:
        raise FilterError(where, f"a string of at most {MAX_STRING} characters")
    if field in RESERVED and not isinstance(v, str):
        raise FilterError(where, f"{field} takes strings")
    if field in DATE_FIELDS:
        return utc_time(v, where)
    if field == "language":
        return language(v, where)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return number(v, where)
    return v


def _range(cond: dict[str, Any], path: str, field: str) -> dict[str, Any]:
    if field in STRING_FIELDS:
        raise FilterError(path, f"{field} takes equality or $in, not a range")
    if ("$gte" in cond and "$gt" in cond) or ("$lte" in cond and "$lt" in cond):
        raise FilterError(path, "one lower bound ($gte or $gt) and one upper bound ($lte or $lt) at most")
    out: dict[str, Any] = {}
    kinds = set()
    for op in sorted(cond):
        v, where = cond[op], f"{path}.{op}"
        if isinstance(v, (int, float)) and not isinstance(v, bool) and field not in DATE_FIELDS:
            kinds.add("number")
            v = number(v, where)
        elif isinstance(v, str) and len(v) <= MAX_STRING:
            kinds.add("time")
            v = utc_time(v, where)
        else:
            what = "an ISO 8601 date or time" if field in DATE_FIELDS else "a number or an ISO 8601 date or time"
            raise FilterError(where, f"a bound is {what}")
        if len(kinds) > 1:
            raise FilterError(path, "both bounds are numbers or both are dates")
        out[op] = v
    return out


def canonical(filter: Any) -> dict[str, Any] | None:
    """``filter`` checked and in canonical form (kb.search_filter's): ``{"f": {"$in": [...]}}``
    for equality and $in, ``{"f": {"$gte": a, ...}}`` for a range, dates as UTC text,
    numbers as doubles, languages normalised, fields in sorted order; None for no filter
    (None or ``{}``). Raises :class:`FilterError`."""
    if filter is None or filter == {}:
        return None
    if not isinstance(filter, dict):
        raise FilterError("filter", f"a filter is a JSON object of fields, got {_kind(filter)}")
    if len(filter) > MAX_FIELDS:
        raise FilterError("filter", f"at most {MAX_FIELDS} fields")
    out: dict[str, Any] = {}
    for field in sorted(filter):
        if isinstance(field, str) and field.startswith("$"):
            raise FilterError(f"filter.{field[:40]}", f"{field[:40]} is not supported: a filter is fields that all"
                              " must match; for alternatives of one field use {\"field\": {\"$in\": [...]}}")
        if not isinstance(field, str) or not FIELD_NAME.fullmatch(field):
            raise FilterError("filter", f"{_FIELD_RULE}, got {str(field)[:80]}")
        path, cond = f"filter.{field}", filter[field]
        if not isinstance(cond, dict):
            cond = {"$eq": cond}
        if not cond:
            raise FilterError(path, "an empty condition")
        for op in sorted(cond):
            if not op.startswith("$"):
                raise FilterError(f"{path}.{op[:40]}", "a condition is a value or an object of operators"
                                  f" ({', '.join(OPERATORS)}); nested fields are not supported")
            if op not in OPERATORS:
                raise FilterError(f"{path}.{op[:40]}", f"unknown operator {op[:40]}; allowed: {', '.join(OPERATORS)}")
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


def terms(canonical_filter: dict[str, Any] | None) -> int:
    """A canonical filter's terms, what its cost grows with: each value of an equality or
    ``$in`` (one predicate each over the documents), each range (one index range scan)."""
    if not canonical_filter:
        return 0
    return sum(len(c["$in"]) if "$in" in c else 1 for c in canonical_filter.values())
