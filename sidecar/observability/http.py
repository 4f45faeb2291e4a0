"""The metrics listener (adapter): GET /metrics (Prometheus text), /healthz, /readyz.

A tiny asyncio HTTP/1.1 server, one request per connection, so that the collector runs on the
node's event loop (the state it reads is only touched there). Unauthenticated, like most
Prometheus endpoints and probes: bind it where scrapers and the orchestrator reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from sidecar.observability.health import HealthFacts, liveness, readiness

__all__ = ["MetricsServer", "MetricsServerError", "parse_request"]

log = logging.getLogger("mqfed.metrics")

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


class MetricsServerError(RuntimeError):
    """The metrics listener cannot bind; the message says why."""


def parse_request(head: bytes) -> tuple[str, str] | None:
    """(method, path without query) of an HTTP request head, or None if it is not one."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    return parts[0], parts[1].split("?", 1)[0]


class MetricsServer:
    """Serves one node's metrics and health on `listen` (HOST:PORT)."""

    def __init__(self, listen: str, registry: CollectorRegistry,
                 facts: Callable[[], HealthFacts]) -> None:
        self.listen = listen
        self.registry = registry
        self.facts = facts
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        host, _, port = self.listen.rpartition(":")
        try:
            self._server = await asyncio.start_server(self._serve, host.strip("[]"), int(port))
        except OSError as exc:
            raise MetricsServerError(f"cannot listen for metrics on {self.listen}: "
                                     f"{exc.strerror}; choose another admin.metrics "
                                     "(or '' for none)") from None
        log.info("metrics listening", extra={"listen": self.listen})

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"only GET\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path in ("/healthz", "/livez"):
            return (*_json(liveness(self.facts())),)
        if path == "/readyz":
            return (*_json(readiness(self.facts())),)
        return 404, "text/plain", b"not found: try /metrics, /healthz or /readyz\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            request = parse_request(head)
            if request is None:
                status, ctype, body = 400, "text/plain", b"bad request\n"
            else:
                status, ctype, body = self.respond(*request)
            head_only = request is not None and request[0] == "HEAD"
            writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
                         f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + (b"" if head_only else body))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError):
            pass
        except Exception:
            log.exception("metrics request failed")
        finally:
            writer.close()


def _json(answer: tuple[int, bytes]) -> tuple[int, str, bytes]:
    return answer[0], "application/json", answer[1]
