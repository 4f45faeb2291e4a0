"""The metrics listener (adapter): GET /metrics (Prometheus text), /healthz, /readyz, and the
status page's paths when a `pages` handler is given (`sidecar.statuspage`).

A tiny asyncio HTTP/1.1 server, one request per connection, so that the collector runs on the
node's event loop (the state it reads is only touched there). /metrics and the probes are
unauthenticated, like most Prometheus endpoints and probes: bind it where scrapers and the
orchestrator reach it. The status page checks the admin token itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from sidecar.observability.health import HealthFacts, liveness, readiness

__all__ = ["MetricsServer", "MetricsServerError", "Pages", "Request", "Response",
           "parse_request"]

log = logging.getLogger("mqfed.metrics")

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 500: "Internal Server Error",
            503: "Service Unavailable"}


class MetricsServerError(RuntimeError):
    """The metrics listener cannot bind; the message says why."""


@dataclass(frozen=True)
class Request:
    """One request head: the path without its query, the query's parameters (the last of a
    repeated name wins) and the headers by lower-case name."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


Pages = Callable[[Request], Awaitable[Response | None]]
"""Answers the paths it knows (None for the others)."""


def parse_request(head: bytes) -> Request | None:
    """The request of an HTTP request head, or None if it is not one."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    path, _, query = parts[1].partition("?")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return Request(parts[0], path, dict(parse_qsl(query)), headers)


class MetricsServer:
    """Serves one node's metrics and health on `listen` (HOST:PORT), and `pages`."""

    def __init__(self, listen: str, registry: CollectorRegistry,
                 facts: Callable[[], HealthFacts], pages: Pages | None = None) -> None:
        self.listen = listen
        self.registry = registry
        self.facts = facts
        self.pages = pages
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
        return 404, "text/plain", (b"not found: try /, /metrics, /healthz or /readyz\n"
                                   if self.pages else
                                   b"not found: try /metrics, /healthz or /readyz\n")

    async def answer(self, request: Request) -> Response:
        if self.pages is not None and request.method in ("GET", "HEAD"):
            page = await self.pages(request)
            if page is not None:
                return page
        return Response(*self.respond(request.method, request.path))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            request = parse_request(head)
            if request is None:
                response = Response(400, "text/plain", b"bad request\n")
            else:
                response = await self.answer(request)
            head_only = request is not None and request.method == "HEAD"
            extra = "".join(f"{k}: {v}\r\n" for k, v in response.headers)
            writer.write(f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}\r\n"
                         f"Content-Type: {response.content_type}\r\n"
                         f"Content-Length: {len(response.body)}\r\n{extra}"
                         "Connection: close\r\n\r\n".encode()
                         + (b"" if head_only else response.body))
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
