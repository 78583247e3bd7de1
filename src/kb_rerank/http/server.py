"""The uvicorn server of ``kb-rerank serve``: its configuration, built from the settings by
:func:`server_config` (the command and the tests build the same one), and its HTTP protocol.

What the configuration sets, and why (uvicorn's defaults are the opposite for the first):

* Proxy headers: ignored unless ``KB_FORWARDED_ALLOW_IPS`` names the proxies. uvicorn's own
  default trusts ``X-Forwarded-For`` from 127.0.0.1, so any local client (or a proxy on the
  same machine that passes the header through) chose its own address, and with it a fresh
  per-address rate bucket on every request.
* ``limit_concurrency`` (``KB_HTTP_LIMIT_CONCURRENCY``): connections and running requests one
  process holds; a request over it is answered 503 at once instead of queueing.
* ``timeout_keep_alive`` (``KB_HTTP_KEEP_ALIVE_S``): an idle kept-alive connection is closed.
* ``h11_max_incomplete_event_size`` (``KB_HTTP_MAX_HEADER_BYTES``): the most bytes of a request
  head buffered while it is incomplete (over it: 400), so an endless head takes bounded memory.
* A header timeout (``KB_HTTP_HEADER_TIMEOUT_S``), which uvicorn does not have (its
  ``Config`` offers no header or read timeout): :class:`HeaderTimeoutProtocol` closes a
  connection whose request line and headers have not all arrived in time. Without it a
  client sending one header line every few seconds holds its connection for ever, and since
  no request ever completes, no per-address limit applies.

Not covered here: a request body sent slowly after complete headers (the route reads it
until the client stops or the body limit is reached). A deployment facing the internet runs
behind a proxy with its own timeouts (nginx: ``client_header_timeout``, ``client_body_timeout``,
``keepalive_timeout``, ``limit_conn``), and sets ``KB_FORWARDED_ALLOW_IPS`` to that proxy's
address so that the per-address bucket sees the clients, not the proxy.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from kb_rerank.core.settings import Settings

APP_FACTORY = "kb_rerank.app:app_from_env"


class ServeConfig(uvicorn.Config):
    """uvicorn's Config plus ``header_timeout_s``, read by :class:`HeaderTimeoutProtocol`.
    A class of its own (not an attribute set afterwards) so that it is pickled with the config
    into each worker process."""

    def __init__(self, app: Any, *, header_timeout_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout_s = header_timeout_s


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head: armed when the connection
    opens and when the first byte of a following request arrives on a kept-alive connection
    (uvicorn's keep-alive timer stops at that byte), cancelled once h11 has parsed the request
    line and headers. When it fires the connection is closed without an answer (a client
    that has not finished its headers could not read one in order anyway)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.header_timeout_s = float(getattr(config, "header_timeout_s", 0.0) or 0.0)
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm_header_timer(self) -> None:
        if self.header_timeout_s > 0 and self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.logger.debug("closing a connection whose request headers did not arrive within %.1f s",
                              self.header_timeout_s)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # IDLE: h11 still waits for (the rest of) a request line and headers
        if self.conn.their_state is h11.IDLE:
            self._arm_header_timer()
        else:
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)


def forwarded_ips(value: str) -> list[str]:
    """``KB_FORWARDED_ALLOW_IPS`` as uvicorn's list (empty: proxy headers off)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def server_config(app: Any, settings: Settings, *, host: str | None = None, port: int | None = None,
                  log_config: dict[str, Any] | None = None, **extra: Any) -> ServeConfig:
    """The uvicorn config of ``kb-rerank serve`` for ``app`` (an app, or an import string
    with ``factory=True`` in ``extra``). ``log_config`` None leaves the process's logging as it
    is (the tests); ``serve`` passes :func:`kb_rerank.core.logs.log_config`."""
    allow = forwarded_ips(settings.forwarded_allow_ips)
    return ServeConfig(
        app,
        host=host or settings.host,
        port=port or settings.port,
        http=HeaderTimeoutProtocol,
        header_timeout_s=float(settings.http_header_timeout_s),
        proxy_headers=bool(allow),
        forwarded_allow_ips=allow or None,
        limit_concurrency=settings.http_limit_concurrency or None,
        timeout_keep_alive=settings.http_keep_alive_s,
        h11_max_incomplete_event_size=settings.http_max_header_bytes,
        log_config=log_config,
        log_level=settings.log_level.lower(),
        access_log=False,  # the app writes its own access record (kb_rerank.access)
        **extra,
    )


def run(config: ServeConfig) -> int:
    """What ``uvicorn.run`` does with a config: one process, or ``workers`` processes sharing
    one socket (uvicorn's supervisor; each worker gets this config, pickled). Returns uvicorn's
    exit status: 3 when a single process did not start (as ``uvicorn.run`` exits)."""
    from uvicorn.supervisors import Multiprocess

    server = uvicorn.Server(config)
    try:
        if config.workers > 1:
            sock = config.bind_socket()
            Multiprocess(config, sockets=[sock]).run()
            return 0
        server.run()
    except KeyboardInterrupt:
        return 0
    return 0 if server.started else 3
