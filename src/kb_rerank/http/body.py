"""The JSON error type of the API and the one request-body decoder every JSON route uses
(``POST /v1/kb/search/rerank``, ``/v1/kb/context``, ``/v2/rerank``), so that a malformed
body gets the same answer on all of them:

* not JSON, invalid UTF-8, or nested deeper than the decoder allows -> 400
  ``{"error": "invalid_json", "field": null, "detail"}`` (nothing in such a body can be
  named reliably, so ``field`` is null);
* a Content-Type other than JSON -> 415 ``{"error": "unsupported_media_type"}`` before the body
  is read (:func:`require_json`; no Content-Type is read as JSON);
* valid JSON of the wrong shape (not an object, wrong type, unknown or missing field,
  value out of range) -> 422 ``{"error": "invalid_request", "field", "detail"}`` where
  ``field`` is the path of the offending value (``documents[3].text``, ``top_n``, ...).

The size limit is not checked here: it is enforced while the body is read (the route's
``request_max_body_size``, see ``kb_rerank.app.create_app``), before any decoding.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


class ApiError(Exception):
    """An error answered as JSON ``payload`` with ``status_code``."""

    def __init__(self, status_code: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(payload.get("error"))
        self.status_code = status_code
        self.payload = payload
        self.headers = headers or {}


def require_json(content_type: str | None) -> None:
    """415 ``unsupported_media_type`` unless ``content_type`` is JSON (``application/json`` or
    ``application/<x>+json``, any parameters); a request without one is read as JSON, as
    clients that send bare bodies (curl ``-d`` aside, which says form) always have been."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise ApiError(415, {"error": "unsupported_media_type", "field": None,
                             "detail": f"Content-Type {media!r} is not JSON: send application/json"})


def invalid(field: str | None, detail: str, **extra: Any) -> ApiError:
    """422 ``invalid_request`` naming ``field``."""
    return ApiError(422, {"error": "invalid_request", "field": field, "detail": detail, **extra})


def invalid_json(detail: str) -> ApiError:
    return ApiError(400, {"error": "invalid_json", "field": None, "detail": detail})


_AT = re.compile(r"at `\$\.?([^`]*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def field_of(msg: str) -> str | None:
    """The path named by a msgspec ValidationError message (``documents[0].metadata.x``)."""
    at = _AT.search(msg)
    path = at.group(1) if at else ""
    m = _UNKNOWN.search(msg) or _MISSING.search(msg)
    if m:
        return f"{path}.{m.group(1)}" if path else m.group(1)
    return path or None


# msgspec's type names, in the words an error body uses
_TYPE_WORDS = {"int": "a whole number", "float": "a number", "str": "a string", "bool": "true or false",
               "array": "a list", "object": "an object", "null": "null", "datetime": "an ISO 8601 date and time"}
_OPS = {">=": "at least", "<=": "at most", ">": "more than", "<": "less than"}
_EXPECTED = re.compile(r"Expected `([^`]+)`(?: of length)?(?: (>=|<=|>|<) ([^ ,]+))?(?:, got `([^`]+)`)?")
_ENUM = re.compile(r"Invalid enum value (.+?)(?: - at|$)")
_BYTE = re.compile(r"\(byte (\d+)\)")


def _types(spec: str) -> str:
    words = [_TYPE_WORDS.get(t.strip(), t.strip()) for t in spec.split("|")]
    words = [w for w in words if w != "null"] or ["null"]
    return " or ".join(dict.fromkeys(words))


def plain(msg: str, field: str | None, allowed: dict[str, Any] | None = None) -> str:
    """A msgspec validation message in plain words naming ``field`` and what is allowed
    (``allowed``: a field's full bounds or choices, where the caller knows them): no decoder
    text reaches a user."""
    name = field or "the body"
    if _MISSING.search(msg):
        return f"{name} is required"
    if _UNKNOWN.search(msg):
        known = (allowed or {}).get("fields") if field and field.isidentifier() else None
        return f"{name} is not a field of this request" + (f"; the fields are: {', '.join(known)}" if known else "")
    bounds = (allowed or {}).get(field or "")
    m = _ENUM.search(msg)
    if m:
        return f"{name} must be one of: {', '.join(map(str, bounds))}" if bounds else f"{name} has a value that is not allowed"
    if "datetime" in msg or "RFC3339" in msg:
        return f"{name} must be an ISO 8601 date and time (2024-11-05 or 2024-11-05T10:00:00Z)"
    m = _EXPECTED.search(msg)
    if m:
        spec, op, bound, got = m.groups()
        kind = _types(spec)
        if "of length" in msg:
            return f"{name} must have a length of {_OPS[op]} {bound}" if op else f"{name} has the wrong length"
        if isinstance(bounds, str):
            return f"{name} must be {kind} {bounds}"
        if op:
            return f"{name} must be {kind} of {_OPS[op]} {bound}"
        if got:
            return f"{name} must be {kind}, not {_types(got)}"
        return f"{name} must be {kind}"
    return f"{name} has a value that is not allowed"


def json_problem(msg: str) -> str:
    """A JSON syntax error in plain words (no decoder text)."""
    if "truncated" in msg:
        return "the body is not complete JSON: it ends before the object is closed"
    m = _BYTE.search(msg)
    where = f" near character {int(m.group(1)) + 1}" if m else ""
    if "UTF-8" in msg or "utf-8" in msg:
        return "the body is not valid UTF-8 text"
    return f"the body is not valid JSON{where}: send one JSON object, such as {{\"query\": \"...\"}}"


def allowed_of(typ: type) -> dict[str, Any]:
    """What a request type allows, for :func:`plain`: its field names, each bounded number's
    full range ("between 0 and 1") and each choice's values."""
    info = msgspec.inspect.type_info(typ)
    out: dict[str, Any] = {"fields": [f.encode_name for f in info.fields]}
    for f in info.fields:
        t = f.type
        for option in getattr(t, "types", (t,)):
            if isinstance(option, msgspec.inspect.LiteralType):
                out[f.encode_name] = list(option.values)
            if not isinstance(option, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
                continue
            ge, gt, hi = getattr(option, "ge", None), getattr(option, "gt", None), getattr(option, "le", None)
            low = f"of at least {ge}" if ge is not None else f"more than {gt}" if gt is not None else None
            if low and hi is not None:
                out[f.encode_name] = f"between {ge} and {hi}" if ge is not None else f"{low} and at most {hi}"
            elif low:
                out[f.encode_name] = low
    return out


def decode_object(raw: bytes) -> dict[str, Any]:
    """Parse ``raw`` as a JSON object (400 / 422 as described in the module docstring).

    The body is parsed without a schema first so that every syntax, encoding and nesting
    error is a 400 whatever the schema would have said about the first value: msgspec
    bounds nesting by the interpreter's recursion limit and raises RecursionError, which
    is a client error here, never a 500."""
    try:
        obj = msgspec.json.decode(raw)
    except RecursionError:
        raise invalid_json("JSON nested too deeply") from None
    except msgspec.DecodeError as exc:
        raise invalid_json(json_problem(str(exc))) from None
    if not isinstance(obj, dict):
        raise invalid(None, "the body must be a JSON object")
    return obj


def convert(obj: dict[str, Any], typ: type[T]) -> T:
    """Validate a decoded object against ``typ`` (a msgspec Struct); 422 naming the field."""
    try:
        return msgspec.convert(obj, typ)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        field = field_of(msg)
        raise invalid(field, plain(msg, field, allowed_of(typ))) from None


def decode(raw: bytes, typ: type[T]) -> T:
    """:func:`decode_object` then :func:`convert`."""
    return convert(decode_object(raw), typ)
