"""Logs of ``kb-rerank serve``: one JSON object a line by default, plain text with
``--log-format text`` / ``KB_LOG_FORMAT=text``; ``KB_LOG_LEVEL`` (INFO).

Standard library only: :class:`JsonFormatter` is a :class:`logging.Formatter`, and
:func:`log_config` a :func:`logging.config.dictConfig` dictionary that uvicorn applies in the
server process and in every worker (``uvicorn.run(log_config=...)``). Each record carries the
request's ``trace_id`` and ``tenant_id`` (context variables put on every record by
:func:`kb_rerank.http.telemetry.install_trace_log_records`); the access record of a request
(logger ``kb_rerank.access``) adds ``route`` (the route template, never the URL's query
string), ``method``, ``status`` and ``duration_ms``. No record carries the query text: the
pipeline logs its keyed hash only.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import queue
import re
import sys
from datetime import datetime, timezone
from logging.handlers import QueueHandler, QueueListener
from typing import Any

# LogRecord's own attributes: everything else on a record came from `extra=` and is emitted
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}
_ALWAYS = ("trace_id", "tenant_id")
# extras that are another rendering of the message, not data: uvicorn's `color_message` (the
# message with ANSI colour codes, for its own coloured formatter)
_DROPPED = frozenset({"color_message"})
# ANSI escape sequences (CSI: colours, cursor moves); a log line is data, not terminal output
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def plain(text: str) -> str:
    """``text`` without ANSI escape sequences."""
    return _ANSI.sub("", text)
FORMATS = ("json", "text")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [trace=%(trace_id)s tenant=%(tenant_id)s] %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, ``trace_id``, ``tenant_id`` (null outside a request), the record's extra
    fields, and ``exc`` (the formatted exception) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": plain(record.getMessage()),
        }
        for key in _ALWAYS:
            out[key] = getattr(record, key, None)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out and key not in _DROPPED:
                out[key] = plain(value) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The plain-text line, with the trace and tenant ids (``-`` outside a request)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)  # other handlers keep None
        for key in _ALWAYS:
            if getattr(record, key, None) is None:
                setattr(record, key, "-")
        return plain(super().format(record))


class BackgroundStreamHandler(QueueHandler):
    """Formats a record on the thread that logs it (so the context's ids are its own) and
    writes the line to stderr on a listener thread: a slow pipe or disk never stalls the
    event loop. Flushed at exit. Python's warnings (a dependency's deprecation notice at
    import) are routed through logging too (logger ``py.warnings``), so that stderr stays one
    record a line in the chosen format instead of a raw warning between JSON lines."""

    def __init__(self) -> None:
        super().__init__(queue.SimpleQueue())
        self.listener = QueueListener(self.queue, logging.StreamHandler(sys.stderr))
        self.listener.start()
        atexit.register(self.listener.stop)
        logging.captureWarnings(True)


def log_config(fmt: str = "json", level: str = "INFO") -> dict[str, Any]:
    """The dictConfig of ``serve``: every record (root, uvicorn's, ours) to stderr in ``fmt``,
    written off the event loop (:class:`BackgroundStreamHandler`).
    uvicorn's own access log is off: the app writes one access record per request
    (``kb_rerank.access``) with the route template, status, duration and ids."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: choose one of {', '.join(FORMATS)}")
    formatter = {"()": f"{__name__}.{'JsonFormatter' if fmt == 'json' else 'TextFormatter'}"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"kb": formatter},
        "handlers": {"stderr": {"()": f"{__name__}.BackgroundStreamHandler", "formatter": "kb"}},
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            # uvicorn's loggers propagate to the root handler, once
            "uvicorn": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            # alembic (read for the head revision) logs its plugin set-up at INFO: noise here
            "alembic": {"handlers": [], "level": "WARNING", "propagate": True},
        },
    }
