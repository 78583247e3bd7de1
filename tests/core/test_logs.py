"""Logs of `kb-rerank serve`: by default one JSON object a line, each with
`trace_id` and `tenant_id`, an access record per request with route, method, status and
duration, never the query text; plain text with `--log-format text`; INFO by default. Run
against a real `kb-rerank serve` process with the tiny cross-encoder."""

from __future__ import annotations

import json
import logging

import httpx

from kb_rerank.core.logs import JsonFormatter, TextFormatter, log_config
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

from tests.live_server import SECRET, bearer, serve_process

URL = "/v1/kb/search/rerank"
MARKER = "zqxlogmarker"  # a word of the query that must appear in no log line


def _env(owner_url, app_url, model_dir):
    return {"KB_DATABASE_URL": owner_url, "KB_APP_DATABASE_URL": app_url, "KB_JWT_SECRET": SECRET,
            "KB_RERANKER_MODEL": str(model_dir), "KB_WORKERS": "1"}


def _requests(base, tenant):
    ok = httpx.post(base + URL, json={"query": f"ERR_402 at checkout {MARKER}"}, headers=bearer(tenant), timeout=60)
    assert ok.status_code == 200, ok.text
    bad = httpx.post(base + URL, json={"query": f"hello {MARKER}"}, timeout=10,
                     headers={"Authorization": "Bearer not-a-token", "X-Trace-Id": "trace-of-the-401"})
    assert bad.status_code == 401
    invalid = httpx.post(base + URL, json={"query": f"x {MARKER}", "source": "nope"}, headers=bearer(tenant),
                         timeout=10)
    assert invalid.status_code == 422
    return ok.headers["x-trace-id"], invalid.headers["x-trace-id"]


def test_serve_writes_json_lines_with_ids_and_never_the_query(settings, owner_url, app_url, sample_tenant, tmp_path):
    log_path = tmp_path / "server.log"
    with serve_process(_env(owner_url, app_url, build_tiny_cross_encoder(tmp_path / "ce", seed=0)), log_path) \
            as (base, _proc):
        ok_trace, invalid_trace = _requests(base, sample_tenant)
    text = log_path.read_text(encoding="utf-8")
    assert MARKER not in text
    lines = [line for line in text.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all(isinstance(r, dict) for r in records) and len(records) >= 5
    for r in records:
        assert {"time", "level", "logger", "message", "trace_id", "tenant_id"} <= set(r), r
    assert {r["level"] for r in records} <= {"INFO", "WARNING", "ERROR"}  # INFO by default: no DEBUG
    assert any(r["message"].startswith("kb-rerank api ready") for r in records)
    # uvicorn's records carry `color_message` (the message with ANSI codes): not data, not logged;
    # alembic's plugin set-up lines (the head revision is read at start-up) neither
    assert any(r["logger"] == "uvicorn.error" for r in records)
    assert "\x1b" not in text and not any("color_message" in r for r in records)
    assert not any(r["logger"].startswith("alembic") for r in records)

    access = [r for r in records if r["logger"] == "kb_rerank.access"]
    by_trace = {r["trace_id"]: r for r in access}
    ok = by_trace[ok_trace]
    assert ok["route"] == URL and ok["method"] == "POST" and ok["status"] == 200
    assert ok["tenant_id"] == str(sample_tenant)
    assert isinstance(ok["duration_ms"], (int, float)) and ok["duration_ms"] > 0
    unauthorized = by_trace["trace-of-the-401"]  # the caller's X-Trace-Id, on the 401 too
    assert unauthorized["status"] == 401 and unauthorized["tenant_id"] is None
    assert by_trace[invalid_trace]["status"] == 422 and by_trace[invalid_trace]["tenant_id"] == str(sample_tenant)
    # the pipeline's own record of the served request carries the same ids
    served = [r for r in records if r["trace_id"] == ok_trace and r["logger"].startswith("kb_rerank.endpoints")]
    assert served and all(r["tenant_id"] == str(sample_tenant) for r in served)
    # /readyz polls of the harness are logged too, outside any tenant
    assert any(r["route"] == "/readyz" and r["tenant_id"] is None for r in access)


def test_serve_log_format_text(settings, owner_url, app_url, sample_tenant, tmp_path):
    log_path = tmp_path / "server.log"
    with serve_process(_env(owner_url, app_url, build_tiny_cross_encoder(tmp_path / "ce", seed=0)), log_path,
                       args=("--log-format", "text")) as (base, _proc):
        ok_trace, _ = _requests(base, sample_tenant)
    text = log_path.read_text(encoding="utf-8")
    assert MARKER not in text
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            continue
        raise AssertionError(f"a JSON line in text mode: {line}")
    access = [line for line in lines if f"[trace={ok_trace} tenant={sample_tenant}]" in line
              and "kb_rerank.access" in line]
    assert access and f"POST {URL} 200" in access[0]


def test_formatters_and_config():
    rec = logging.LogRecord("kb_rerank.x", logging.WARNING, __file__, 1, "n=%d", (3,), None)
    rec.trace_id, rec.tenant_id, rec.route = "t1", None, "/r"
    out = json.loads(JsonFormatter().format(rec))
    assert out["message"] == "n=3" and out["trace_id"] == "t1" and out["tenant_id"] is None and out["route"] == "/r"
    assert out["level"] == "WARNING" and out["time"].endswith("+00:00")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        rec.exc_info = sys.exc_info()
    assert "RuntimeError: boom" in json.loads(JsonFormatter().format(rec))["exc"]
    rec2 = logging.LogRecord("kb_rerank.x", logging.INFO, __file__, 1, "hi", None, None)
    assert "[trace=- tenant=-] hi" in TextFormatter().format(rec2)
    cfg = log_config("text", "WARNING")
    assert cfg["root"]["level"] == "WARNING" and cfg["formatters"]["kb"]["()"].endswith("TextFormatter")
    try:
        log_config("xml")
    except ValueError as exc:
        assert "xml" in str(exc)
    else:
        raise AssertionError("log_config accepted an unknown format")


def test_json_lines_drop_colour_codes_and_uvicorns_color_message():
    rec = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process [%d]", (42,), None)
    rec.color_message = "Started server process [\x1b[36m%d\x1b[0m]"  # as uvicorn logs it
    rec.route = "\x1b[1m/r\x1b[0m"
    out = json.loads(JsonFormatter().format(rec))
    assert out["message"] == "Started server process [42]" and "color_message" not in out and out["route"] == "/r"
    coloured = logging.LogRecord("x", logging.INFO, __file__, 1, "\x1b[32mINFO\x1b[0m: up", None, None)
    assert json.loads(JsonFormatter().format(coloured))["message"] == "INFO: up"
    assert TextFormatter().format(coloured).endswith("] INFO: up")
    assert log_config("json")["loggers"]["alembic"]["level"] == "WARNING"


def test_a_python_warning_is_a_json_line_too():
    """A dependency's warning (a deprecation notice at import, say) raised under serve's log
    configuration comes out as one JSON record of logger py.warnings, not as raw text between
    the JSON lines."""
    import subprocess
    import sys

    code = ("import logging.config, warnings\n"
            "from kb_rerank.core.logs import log_config\n"
            "logging.config.dictConfig(log_config('json', 'INFO'))\n"
            "warnings.warn('Support for Transformers < 5.6 is deprecated', FutureWarning)\n"
            "logging.getLogger('kb_rerank').info('after the warning')\n")
    out = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]
    warned = [r for r in records if r.get("logger") == "py.warnings"]
    assert len(warned) == 1 and "FutureWarning" in warned[0]["message"], records
    assert any(r.get("message") == "after the warning" for r in records)
