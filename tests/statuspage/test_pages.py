"""`StatusPage` on a stand-in admin server (in process): which paths it answers, the token,
the JSON, the server-side page, the answer reused by close polls."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client.registry import CollectorRegistry

from sidecar._proto import admin_pb2
from sidecar.admin.server import AdminUnavailable
from sidecar.observability.health import HealthFacts
from sidecar.observability.http import MetricsServer, Request, Response
from sidecar.statuspage.access import PageAccess
from sidecar.statuspage.html import script_hash
from sidecar.statuspage.pages import TEMPLATE, StatusPage
from tests.statuspage.test_model import reply


class Server:
    """Answers Status with `test_model.reply()` (its n1 forwarded counter grows 100 per call)
    and Routes for topics under a/."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.unavailable = False

    async def answer(self, name: str, query: admin_pb2.Query) -> Any:
        self.calls.append(name)
        if self.unavailable:
            raise AdminUnavailable("node n1 is still starting; try again")
        if name == "Status":
            r = reply()
            r.statuses[0].forwarded += 100 * len(self.calls)
            return r
        if not query.topic.startswith("a/"):
            raise ValueError(f"topic {query.topic!r}: invalid")
        return admin_pb2.RoutesReply(answered_by="n1", routes=[
            admin_pb2.Route(from_node="n1", to_node="n2", filter="a/+")])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def get(pages: StatusPage, path: str, token: str | None = None, **query: str) -> Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    response = asyncio.run(pages(Request("GET", path, query, headers)))
    assert response is not None
    return response


def make(access: PageAccess, server: Server | None = None) -> tuple[StatusPage, Server, Clock]:
    server = server or Server()
    clock = Clock()
    return StatusPage(lambda: server, access, "n1", "c1", clock), server, clock


def test_only_its_paths() -> None:
    pages, _, _ = make(PageAccess(None, open=True))
    assert asyncio.run(pages(Request("GET", "/metrics"))) is None


def test_token_required() -> None:
    pages, server, _ = make(PageAccess("s3cret"))
    denied = get(pages, "/status.json")
    assert denied.status == 401
    assert json.loads(denied.body) == {"error": "the status page needs the admin token"}
    assert get(pages, "/routes.json", "wrong", topic="a/b").status == 401
    page = get(pages, "/")
    assert page.status == 401 and b'id="login"' in page.body and b"data-node=" not in page.body
    assert b'id="login" hidden' not in page.body
    assert ("WWW-Authenticate", 'Bearer realm="mqfed status"') in page.headers  # no dialog
    assert ("WWW-Authenticate", 'Bearer realm="mqfed status"') in denied.headers
    basic = get(pages, "/", login="basic")
    assert ("WWW-Authenticate", 'Basic realm="mqfed status", charset="UTF-8"') in basic.headers
    assert server.calls == []  # nothing was asked of the cluster
    assert get(pages, "/status.json", "s3cret").status == 200
    ok = get(pages, "/", "s3cret")
    assert ok.status == 200 and b'data-node="n1"' in ok.body and b'id="login" hidden' in ok.body


def test_status_json_rates_and_reuse() -> None:
    pages, server, clock = make(PageAccess(None, open=True))
    first = json.loads(get(pages, "/status.json").body)
    assert first["nodes"][0]["forwarded"] == 1100 and first["nodes"][0]["rate_out"] is None
    assert set(first["html"]) == {"summary", "nodes", "links"}
    clock.now += 0.2  # a second viewer at nearly the same time: the same answer
    assert json.loads(get(pages, "/status.json").body) == first
    assert server.calls == ["Status"]
    clock.now += 1.8
    second = json.loads(get(pages, "/status.json").body)
    assert second["nodes"][0]["forwarded"] == 1200
    assert second["nodes"][0]["rate_out"] == 50.0  # 100 more in 2 s


def test_routes_json() -> None:
    pages, _, _ = make(PageAccess(None, open=True))
    data = json.loads(get(pages, "/routes.json", topic="a/b").body)
    assert data["delivered_by"] == ["n2"] and 'id="delivered-by">n2<' in data["html"]
    bad = get(pages, "/routes.json", topic="zz")
    assert bad.status == 400 and "invalid" in json.loads(bad.body)["error"]
    assert get(pages, "/routes.json").status == 400


def test_page_renders_routes_and_sections_server_side() -> None:
    pages, _, _ = make(PageAccess(None, open=True))
    page = get(pages, "/", topic="a/b").body.decode()
    assert 'data-node="n3"' in page and "state-down" in page and "link-down" in page
    assert 'id="delivered-by">n2<' in page and 'value="a/b"' in page
    csp = dict(get(pages, "/").headers)["Content-Security-Policy"]
    assert f"script-src '{script_hash(TEMPLATE)}'" in csp and "connect-src 'self'" in csp


def test_starting_node() -> None:
    server = Server()
    server.unavailable = True
    pages, _, _ = make(PageAccess(None, open=True), server)
    down = get(pages, "/status.json")
    assert down.status == 503 and "starting" in json.loads(down.body)["error"]
    page = get(pages, "/")
    assert page.status == 200 and b"still starting" in page.body
    none = StatusPage(lambda: None, PageAccess(None, open=True), "n1", "c1")
    assert get(none, "/status.json").status == 503


def test_read_only_on_the_metrics_listener() -> None:
    """Behind the metrics listener: GET and HEAD only; /metrics and the probes still answer."""
    pages, server, _ = make(PageAccess(None, open=True))
    http = MetricsServer("127.0.0.1:0", CollectorRegistry(),
                         lambda: HealthFacts("n1", True, False, 0.0, None), pages)
    for method in ("POST", "PUT", "DELETE"):
        for path in ("/", "/status.json", "/routes.json"):
            assert asyncio.run(http.answer(Request(method, path))).status == 405
    assert server.calls == []
    assert asyncio.run(http.answer(Request("GET", "/metrics"))).status == 200
    assert asyncio.run(http.answer(Request("GET", "/readyz"))).status == 200
    assert asyncio.run(http.answer(Request("HEAD", "/status.json"))).status == 200
    missing = asyncio.run(http.answer(Request("GET", "/nope")))
    assert missing.status == 404 and b"try /," in missing.body


def test_concurrent_polls_share_one_fan_out() -> None:
    class Slow(Server):
        async def answer(self, name: str, query: admin_pb2.Query) -> Any:
            await asyncio.sleep(0.05)
            return await super().answer(name, query)

    pages, server, _ = make(PageAccess(None, open=True), Slow())

    async def many() -> list[Response | None]:
        return await asyncio.gather(*(pages(Request("GET", "/status.json")) for _ in range(5)))
    answers = asyncio.run(many())
    assert server.calls == ["Status"]
    assert len({a.body for a in answers if a is not None}) == 1
