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
        raise invalid_json(str(exc)) from None
    if not isinstance(obj, dict):
        raise invalid(None, "the body must be a JSON object")
    return obj


def convert(obj: dict[str, Any], typ: type[T]) -> T:
    """Validate a decoded object against ``typ`` (a msgspec Struct); 422 naming the field."""
    try:
        return msgspec.convert(obj, typ)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        raise invalid(field_of(msg), msg) from None


def decode(raw: bytes, typ: type[T]) -> T:
    """:func:`decode_object` then :func:`convert`."""
    return convert(decode_object(raw), typ)
