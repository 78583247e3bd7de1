"""Issue 13 item 9 (HTTP part) and item 7 (the example deployment).

* /metrics and /readyz's detail (model name, ``last_error``, revisions, exception names)
  were public. They now need ``Authorization: Bearer <KB_OPS_TOKEN>``: without it /metrics
  is 404 (no token configured) or 401, and /readyz answers only ``{"status"}`` with the same
  status code. /healthz stays public.
* docker/compose.yaml shipped a placeholder KB_JWT_SECRET, published on 0.0.0.0 and gave
  the serving container the superuser URL (its CMD migrated before serving). There is no
  Docker engine here: the files are parsed and their properties checked.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import yaml
from litestar.testing import TestClient

from kb_rerank.app import create_app

from tests.live_server import OPS, OPS_TOKEN, SECRET, URL, FakeReranker, bearer

ROOT = Path(__file__).resolve().parents[2]
SECRET_ERROR = "model file /secret/path/model.bin is corrupt"


class FailedReranker(FakeReranker):
    """A model whose load failed, with an internal detail in its error."""

    ready = False
    state = "failed"
    last_error = SECRET_ERROR

    async def ensure_loaded_async(self):
        return False


def _client(settings, embedder, reranker=None, **changes):
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0, **changes),
                     reranker=reranker or FakeReranker(), embedder=embedder)
    return TestClient(app)


BAD_AUTH = [
    {},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer " + OPS_TOKEN[:-1]},
    {"Authorization": "Bearer " + OPS_TOKEN + "x"},
    {"Authorization": "Basic " + OPS_TOKEN},
    {"Authorization": OPS_TOKEN},
]


def test_metrics_need_the_ops_token(settings, embedder, sample_tenant):
    with _client(settings, embedder, ops_token=OPS_TOKEN) as c:
        assert c.post(URL, json={"query": "ops metrics"}, headers=bearer(sample_tenant)).status_code == 200
        for h in BAD_AUTH:
            r = c.get("/metrics", headers=h)
            assert r.status_code == 401, (h, r.status_code)
            assert r.json()["error"] == "unauthorized" and "kb_rerank" not in r.text
            assert r.headers["www-authenticate"].startswith("Bearer")
        # a tenant's JWT is not an ops token
        assert c.get("/metrics", headers=bearer(sample_tenant)).status_code == 401
        r = c.get("/metrics", headers=OPS)
        assert r.status_code == 200 and "kb_rerank_http_requests_total" in r.text
        assert c.get("/metrics", headers={"Authorization": "bearer  " + OPS_TOKEN}).status_code == 200


def test_metrics_disabled_without_an_ops_token(settings, embedder):
    with _client(settings, embedder) as c:
        for h in (*BAD_AUTH, OPS):
            r = c.get("/metrics", headers=h)
            assert r.status_code == 404 and "kb_rerank" not in r.text, (h, r.status_code)
            assert r.json()["error"] == "not_found"


@pytest.mark.parametrize("ops_token", [OPS_TOKEN, None])
def test_readyz_is_coarse_without_the_token(settings, embedder, ops_token):
    # a failed model with the database fine: "degraded" (503 by default: KB_READY_WHEN_DEGRADED)
    with _client(settings, embedder, reranker=FailedReranker(), ops_token=ops_token) as c:
        for h in BAD_AUTH:
            r = c.get("/readyz", headers=h)
            assert r.status_code == 503 and r.json() == {"status": "degraded"}, (h, r.text)
            assert SECRET_ERROR not in r.text
        full = c.get("/readyz", headers=OPS)
        assert full.status_code == 503
        if ops_token:
            body = full.json()
            assert body["model"]["last_error"] == SECRET_ERROR and body["model"]["state"] == "failed"
            assert body["database"] == "ok" and body["schema"] == "ok" and body["status"] == "degraded"
        else:  # no token configured: nobody gets the detail
            assert full.json() == {"status": "degraded"}
        # a database that is down: still the status code a load balancer needs, no detail
        c.blocking_portal.call(c.app.state.pipeline.pool.close)
        down = c.get("/readyz")
        assert down.status_code == 503 and down.json() == {"status": "not_ready"}
        if ops_token:
            detail = c.get("/readyz", headers=OPS).json()
            assert detail["database"] == "unavailable" and detail["error"]


def test_healthz_stays_public(settings, embedder):
    with _client(settings, embedder, ops_token=OPS_TOKEN) as c:
        assert c.get("/healthz").json() == {"status": "ok"}


def test_ops_token_must_be_strong(settings):
    for weak in ("short", "change-me-ops-token-0123456789abcdef", "x" * 40):
        with pytest.raises(ValueError) as ei:
            create_app(settings.with_(jwt_secret=SECRET, ops_token=weak))
        assert "KB_OPS_TOKEN" in str(ei.value)


def test_ops_token_from_env():
    from kb_rerank.core.settings import Settings

    assert Settings.from_env({"KB_OPS_TOKEN": OPS_TOKEN}).ops_token == OPS_TOKEN
    assert Settings.from_env({"KB_OPS_TOKEN": ""}).ops_token is None  # compose's ${KB_OPS_TOKEN:-}


# --------------------------------------------------------------------------- item 7: docker/


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text("utf-8"))


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_compose_migrates_in_a_one_shot_service_with_the_owner_url():
    services = _compose()["services"]
    mig = services["migrate"]
    cmd = mig["command"] if isinstance(mig["command"], list) else mig["command"].split()
    assert cmd == ["kb-rerank", "migrate"]
    assert mig.get("restart", "no") == "no" and "ports" not in mig
    assert _env(mig)["KB_DATABASE_URL"].startswith("postgresql://postgres:")
    assert mig["depends_on"]["db"]["condition"] == "service_healthy"


def test_compose_app_holds_only_the_app_role_url():
    services = _compose()["services"]
    app = services["app"]
    env = _env(app)
    assert "KB_DATABASE_URL" not in env and "POSTGRES_PASSWORD" not in env
    assert env["KB_APP_DATABASE_URL"].startswith("postgresql://cyberos_app:")
    assert not any("postgres:" in v.split("@")[0] for v in env.values() if v.startswith("postgresql://"))
    assert app["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert "command" not in app  # the image's CMD: serve only


def test_compose_publishes_on_loopback_only():
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            spec = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port.get('published')}"
            assert spec.startswith("127.0.0.1:"), (name, port)
    assert "ports" not in _compose()["services"]["db"]


def test_compose_commits_no_secret():
    """Every secret-bearing value comes from the environment / docker/.env with `${VAR:?}`
    (compose stops with the name when it is missing), and none is a placeholder."""
    from kb_rerank.http.auth import check_secret

    text = (ROOT / "docker" / "compose.yaml").read_text("utf-8")
    assert "change-me" not in text.lower() and "changeme" not in text.lower()
    for name, service in _compose()["services"].items():
        for key, value in _env(service).items():
            if re.search(r"SECRET|PASSWORD|TOKEN|_URL$", key):
                refs = re.findall(r"\$\{([A-Z_]+)(:\?|:-)", value)
                assert refs, (name, key, value)  # interpolated, never literal
                literal = re.sub(r"\$\{[^}]*\}", "", value)
                assert not re.search(r":[^/@:]+@", literal), (name, key)  # no literal password in a URL
                if key in ("KB_JWT_SECRET", "POSTGRES_PASSWORD", "KB_APP_PASSWORD"):
                    assert all(mode == ":?" for _, mode in refs), (name, key)
    # the old placeholder is refused by the check the app runs at start-up
    with pytest.raises(ValueError):
        check_secret("KB_JWT_SECRET", "change-me-to-a-secret-of-at-least-32-bytes")
    assert "docker/.env" in (ROOT / ".gitignore").read_text("utf-8").split()


def test_dockerfile_cmd_only_serves():
    lines = (ROOT / "docker" / "Dockerfile").read_text("utf-8").splitlines()
    cmd = [ln for ln in lines if ln.startswith("CMD")]
    assert len(cmd) == 1 and "serve" in cmd[0] and "migrate" not in cmd[0] and "&&" not in cmd[0]


def test_serve_refuses_a_weak_ops_token(monkeypatch, capsys):
    from kb_rerank.cli import main as cli

    monkeypatch.delenv("KB_JWT_PUBLIC_KEY", raising=False)
    monkeypatch.setenv("KB_JWT_SECRET", SECRET)
    monkeypatch.setenv("KB_OPS_TOKEN", "example-ops-token-0123456789abcdef")

    def no_server(*a, **kw):
        raise AssertionError("the server was started: the start-up checks let it through")

    monkeypatch.setattr("kb_rerank.http.server.run", no_server)
    assert cli.main(["serve", "--port", "1"]) == 2
    assert "KB_OPS_TOKEN" in capsys.readouterr().err


def test_tenant_token_cannot_read_other_tenants_metrics(settings, embedder):
    """The point of the token: a tenant (who holds a valid JWT) learns nothing about others'
    traffic from /metrics."""
    with _client(settings, embedder, ops_token=OPS_TOKEN) as c:
        r = c.get("/metrics", headers=bearer(uuid.uuid4()))
        assert r.status_code == 401 and "kb_rerank_cache" not in r.text
