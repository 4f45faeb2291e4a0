"""The status page's paths on the metrics listener (adapter): `/` (HTML), `/status.json` and
`/routes.json?topic=T`, all GET only and read-only, answered with the admin server's own
cluster-wide `Status` and `Routes` queries (what `mqfed ctl status` and `mqfed ctl routes
--topic T` show)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from html import escape
from importlib import resources
from typing import TYPE_CHECKING, Any

from sidecar._proto import admin_pb2
from sidecar.admin.directory import UnknownNode
from sidecar.admin.server import AdminUnavailable
from sidecar.observability.http import Request, Response
from sidecar.statuspage.access import PageAccess
from sidecar.statuspage.html import (
    links_html,
    nodes_html,
    page,
    routes_html,
    script_hash,
    summary_html,
)
from sidecar.statuspage.model import counters, routes_data, status_data
from sidecar.statuspage.rates import RateMeter

if TYPE_CHECKING:
    from sidecar.admin.server import AdminServer

__all__ = ["PATHS", "TEMPLATE", "StatusPage"]

PATHS = ("/", "/status.json", "/routes.json")
TEMPLATE = resources.files("sidecar.statuspage").joinpath("page.html").read_text("utf-8")
"""The page: one file, inline CSS and script, no external asset."""
REUSE = 0.5
"""Seconds a cluster-wide status answer serves further polls (several open pages ask the
cluster once; polls during a fan-out wait for it)."""

_HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"))
_BEARER = ("WWW-Authenticate", 'Bearer realm="mqfed status"')
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src '{script}'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


class _Failed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class StatusPage:
    """Answers the status page's paths of one node (None for other paths)."""

    def __init__(self, server: Callable[[], AdminServer | None], access: PageAccess,
                 node_id: str, cluster: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.access = access
        self.node_id = node_id
        self.cluster = cluster
        self.clock = clock
        self.meter = RateMeter()
        self._last: tuple[float, dict[str, Any]] | None = None
        self._pending: asyncio.Future[dict[str, Any]] | None = None
        self._csp = _CSP.format(script=script_hash(TEMPLATE))

    async def __call__(self, request: Request) -> Response | None:
        if request.path not in PATHS:
            return None
        refusal = self.access.refusal(request.headers)
        try:
            if request.path == "/":
                return await self._page(request, refusal)
            if refusal is not None:
                return _json(401, {"error": refusal}, (_BEARER,))
            if request.path == "/status.json":
                return _json(200, await self.status())
            topic = request.query.get("topic", "")
            return _json(200, await self.routes(topic))
        except _Failed as exc:
            return _json(exc.status, {"error": str(exc)})

    async def status(self) -> dict[str, Any]:
        """The cluster's status with rates and the page's sections (reused for `REUSE`
        seconds)."""
        now = self.clock()
        if self._last is not None and now - self._last[0] < REUSE:
            return self._last[1]
        if self._pending is None:  # polls arriving meanwhile share the fan-out under way
            self._pending = asyncio.ensure_future(self._fresh_status(now))
            self._pending.add_done_callback(self._settled)
        return await asyncio.shield(self._pending)

    def _settled(self, _task: asyncio.Future) -> None:
        self._pending = None

    async def _fresh_status(self, now: float) -> dict[str, Any]:
        reply = await self._ask("Status", admin_pb2.Query())
        data = status_data(reply, self.meter.observe(self.clock(), counters(reply)))
        data["html"] = {"summary": summary_html(data),
                        "nodes": nodes_html(data["nodes"]),
                        "links": links_html(data["nodes"], data["links"])}
        self._last = (now, data)
        return data

    async def routes(self, topic: str) -> dict[str, Any]:
        if not topic:
            raise _Failed(400, "give a topic: /routes.json?topic=a/b")
        data = routes_data(topic, await self._ask("Routes", admin_pb2.Query(topic=topic)))
        data["html"] = routes_html(data)
        return data

    async def _ask(self, name: str, query: admin_pb2.Query) -> Any:
        server = self.server()
        if server is None:
            raise _Failed(503, f"node {self.node_id} is still starting; try again")
        try:
            return await server.answer(name, query)
        except AdminUnavailable as exc:
            raise _Failed(503, str(exc)) from None
        except (UnknownNode, ValueError) as exc:
            raise _Failed(400, str(exc)) from None

    async def _page(self, request: Request, refusal: str | None) -> Response:
        headers = (*_HEADERS, ("Content-Security-Policy", self._csp))
        topic = request.query.get("topic", "").strip()
        if refusal is not None:
            # Basic makes a browser ask for the token (the page's link for no JavaScript);
            # a Bearer challenge does not, so the page's own form shows
            headers += ((("WWW-Authenticate", 'Basic realm="mqfed status", charset="UTF-8"'),)
                        if request.query.get("login") == "basic" else (_BEARER,))
            body = page(TEMPLATE, self.cluster, self.node_id, {}, topic, signed_in=False,
                        note=refusal if request.headers.get("authorization") else "")
            return Response(401, "text/html; charset=utf-8", body.encode(), headers)
        sections: dict[str, str] = {}
        try:
            data = await self.status()
            sections.update(data["html"])
            if topic:
                sections["routes"] = (await self.routes(topic))["html"]
        except _Failed as exc:
            sections.setdefault("summary", f'<p class="missing">{escape(str(exc))}</p>')
            if topic and "nodes" in sections:
                sections["routes"] = f'<p class="missing">{escape(str(exc))}</p>'
        body = page(TEMPLATE, self.cluster, self.node_id, sections, topic, signed_in=True)
        return Response(200, "text/html; charset=utf-8", body.encode(), headers)


def _json(status: int, data: dict[str, Any],
          extra: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, "application/json", json.dumps(data).encode(), _HEADERS + extra)
