"""The status page in headless Chromium against one real 3-node cluster (etcd, Mosquitto with
the plugin, sidecars) under traffic: the node table without JavaScript, the numbers moving on
an open page, topic searches typed into it, a killed node turning red on it, and a node that
asks for the admin token (its login form). Screenshots go to tests/artifacts/statuspage/
($MQFED_TEST_ARTIFACTS). Tests run in file order on one cluster."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.browser import (
    CHROMIUM,
    Browser,
    artifacts_dir,
    dump_dom,
    screenshot,
    table_rows,
)
from tests.harness.procs import wait_for
from tests.system.cluster.conftest import Probe, connect, detached_cluster, mqfed

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian package `chromium`; "
    "`make install` installs it): the status page's browser test cannot run")


class Page:
    """The cluster and the status page of each of its nodes."""

    def __init__(self, run_dir: Path, info: dict) -> None:
        self.run_dir = run_dir
        self.nodes = {n["id"]: n for n in info["nodes"]}
        self.token = Path(info["admin_token_file"]).read_text().strip()
        self.artifacts = artifacts_dir("statuspage")

    def url(self, node: str, query: str = "") -> str:
        return f"http://{self.nodes[node]['metrics']}/{query}"

    def port(self, node: str) -> int:
        return int(self.nodes[node]["mqtt"].rpartition(":")[2])

    def get(self, node: str, path: str, auth: str = "") -> tuple[int, dict]:
        request = urllib.request.Request(self.url(node, path.lstrip("/")),
                                         headers={"Authorization": auth} if auth else {})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def shot(self, name: str, url: str | Browser, script: bool = True) -> Path:
        """A screenshot of `url` (a fresh browser) or of an open page."""
        path = (url.screenshot(self.artifacts / name) if isinstance(url, Browser)
                else screenshot(url, self.artifacts / name, script=script))
        print(f"screenshot: {path}")
        return path


class Traffic:
    """QoS 1 publishes to st/load/temp from clients on `nodes`, ~100/s each, in a thread."""

    def __init__(self, page: Page, nodes: list[str]) -> None:
        self.clients = {n: connect(page.port(n)) for n in nodes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for probe in list(self.clients.values()):
                probe.client.publish("st/load/temp", b"21.5", qos=1)
            time.sleep(0.01)

    def stop(self, node: str | None = None) -> None:
        if node is None:
            self._stop.set()
            self._thread.join(5)
        for n in [node] if node else list(self.clients):
            probe = self.clients.pop(n, None)
            if probe is not None:
                probe.close()


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    with detached_cluster("mqfed-statuspage-",
                          env={"MQFED_SESSIONS_REPLICAS": "1"}) as (path, info):
        yield Page(path, info)


@pytest.fixture(scope="module")
def traffic(page: Page) -> Iterator[Traffic]:
    """Subscribers on n2 (st/+/temp) and n3 (st/n3/#); publishers on n1 and n3."""
    subs: list[Probe] = [connect(page.port("n2")), connect(page.port("n3"))]
    subs[0].subscribe("st/+/temp")
    subs[1].subscribe("st/n3/#")

    def routed() -> bool:
        code, data = page.get("n1", "/routes.json?topic=st/n3/temp")
        return code == 200 and data["delivered_by"] == ["n2", "n3"] and not data["missing"]
    wait_for(routed, 30, "both subscriptions routed from n1", interval=0.3)
    load = Traffic(page, ["n1", "n3"])
    try:
        yield load
    finally:
        load.stop()
        for s in subs:
            s.close()


def nodes_of(dom: str) -> dict[str, dict]:
    """node id -> {state, totals: {out, in, delivered}, rates: {...}} from the node table."""
    out = {}
    for row in table_rows(dom, "nodes"):
        node = row.attrs.get("data-node")
        if not node:
            continue
        cells = {a["data-rate"]: (a["data-total"], text) for a, text in row.cells
                 if "data-rate" in a}
        out[node] = {"state": row.attrs["class"].removeprefix("state-"),
                     "totals": {k: int(v[0]) for k, v in cells.items()},
                     "rates": {k: v[1] for k, v in cells.items()}}
    return out


def links_of(dom: str) -> dict[tuple[str, str], tuple[str, int]]:
    return {(a["data-from"], a["data-to"]): (a["class"].split("link-")[-1], int(a["data-sent"]))
            for row in table_rows(dom, "links") for a, _ in row.cells if "data-from" in a}


def polls(browser: Browser) -> int:
    return int(browser.eval("Number(document.body.dataset.polls || 0)"))  # type: ignore[arg-type]


def search(browser: Browser, topic: str) -> None:
    """Type `topic` into the page's search box, submit, wait for the answer."""
    browser.eval("document.getElementById('routes').removeAttribute('data-source'); "
                 f"document.getElementById('topic').value = {json.dumps(topic)}; "
                 "document.getElementById('routes-form').requestSubmit()")
    browser.wait("document.getElementById('routes').dataset.source === 'script'",
                 what=f"the routes of {topic}")


def test_node_table_without_javascript(page: Page, traffic: Traffic) -> None:
    dom = dump_dom(page.url("n1", "?topic=st/n3/temp"), script=False)
    assert "static page (JavaScript off)" in dom and "data-polls" not in dom
    nodes = nodes_of(dom)
    assert {n: v["state"] for n, v in nodes.items()} == {"n1": "ready", "n2": "ready",
                                                         "n3": "ready"}
    assert len(links_of(dom)) == 6
    assert '<b id="delivered-by">n2, n3</b>' in dom  # the routes, rendered by the node
    page.shot("status-no-javascript.png", page.url("n1"), script=False)


def test_numbers_move_on_an_open_page(page: Page, traffic: Traffic) -> None:
    with Browser() as browser:
        browser.open(page.url("n1"))
        browser.wait("Number(document.body.dataset.polls) >= 2", what="two polls")
        assert browser.eval("document.getElementById('live').textContent") == "live"
        first, polled = nodes_of(browser.html()), polls(browser)
        links_first = links_of(browser.html())
        time.sleep(3)  # the page polls every 1.5 s
        second, links_second = nodes_of(browser.html()), links_of(browser.html())
        assert polls(browser) >= polled + 1
        search(browser, "st/n3/temp")
        page.shot("status-live.png", browser)
    for node in ("n1", "n3"):  # the publishers' nodes forward to n2
        assert second[node]["totals"]["out"] > first[node]["totals"]["out"] > 0, (first, second)
        assert float(second[node]["rates"]["out"]) > 0, second[node]
    assert second["n2"]["totals"]["delivered"] > first["n2"]["totals"]["delivered"]
    assert float(second["n2"]["rates"]["in"]) > 0
    assert all(state == "up" for state, _ in links_second.values()), links_second
    assert links_second[("n1", "n2")][1] > links_first[("n1", "n2")][1] > 0


def test_topic_search_shows_the_right_nodes(page: Page, traffic: Traffic) -> None:
    with Browser() as browser:
        browser.open(page.url("n3"))  # any node answers for the whole cluster
        for topic, nodes in (("st/n3/temp", "n2, n3"), ("st/k9/temp", "n2"),
                             ("elsewhere", "no node")):
            search(browser, topic)
            shown = browser.eval("document.getElementById('delivered-by').textContent")
            assert shown == nodes, (topic, browser.html()[-3000:])
            assert browser.eval("location.search") == f"?topic={topic.replace('/', '%2F')}"
    bad = page.get("n1", "/routes.json?topic=st/%23")
    assert bad[0] == 400 and "wildcard" in bad[1]["error"]


RED = "rgb(207, 34, 46)"  # --bad in page.html


def test_killed_node_turns_red(page: Page, traffic: Traffic) -> None:
    row = "document.querySelector('#nodes tr[data-node=n3]')"
    with Browser() as browser:
        browser.open(page.url("n1"))
        browser.wait(f"{row} && {row}.className === 'state-ready'", what="n3 ready")
        traffic.stop("n3")
        result = mqfed("stop-node", "--run-dir", str(page.run_dir), "--kill", "n3")
        assert result.returncode == 0, result.stderr
        took = browser.wait(f"{row}.className === 'state-down'", 15, "n3 shown down")
        print(f"n3 shown down {took:.1f} s after the kill, on the open page")
        color = browser.eval(f"getComputedStyle({row}.querySelector('.state')).color")
        assert color == RED
        dom = browser.html()
        page.shot("status-node-down.png", browser)
    nodes, links = nodes_of(dom), links_of(dom)
    assert nodes["n1"]["state"] == nodes["n2"]["state"] == "ready"
    assert links[("n1", "n3")][0] != "up" and links[("n2", "n3")][0] != "up"
    assert "partial answer: no answer from" in dom or "crashed" in dom


def test_node_asking_for_the_token(page: Page) -> None:
    """n3 restarted with admin.status_page_open_on_loopback = false: its page and JSON need
    the admin token (the login form, Bearer, Basic); n1's page shows it ready again."""
    result = mqfed("start-node", "--run-dir", str(page.run_dir), "n3", timeout=90,
                   env={"MQFED_ADMIN_STATUS_PAGE_OPEN_ON_LOOPBACK": "false"})
    assert result.returncode == 0, result.stderr
    code, body = page.get("n3", "/status.json")
    assert (code, body) == (401, {"error": "the status page needs the admin token"})
    assert page.get("n3", "/status.json", "Bearer wrong")[0] == 401
    basic = "Basic " + base64.b64encode(f"me:{page.token}".encode()).decode()
    for auth in (f"Bearer {page.token}", basic):
        code, body = page.get("n3", "/status.json", auth)
        assert code == 200 and {n["id"] for n in body["nodes"]} == {"n1", "n2", "n3"}
    rows = "document.querySelectorAll('#nodes tr[data-node]').length"

    def sign_in(browser: Browser, token: str) -> None:
        browser.eval(f"document.getElementById('token').value = {json.dumps(token)}; "
                     "document.getElementById('login-form').requestSubmit()")

    with Browser() as browser:
        browser.open(page.url("n3"))
        browser.wait("!document.getElementById('login').hidden", what="the login form")
        assert browser.eval(rows) == 0 and browser.eval("document.body.dataset.signedIn") == "0"
        page.shot("status-login.png", browser)
        sign_in(browser, "wrong")
        browser.wait("document.getElementById('login-msg').textContent === "
                     "'wrong admin token'", what="the wrong token refused")
        sign_in(browser, page.token)
        browser.wait(f"{rows} === 3 && document.getElementById('login').hidden",
                     what="the node table after signing in")
        assert browser.eval("sessionStorage.getItem('mqfed-admin-token')") == page.token
        browser.open(page.url("n3"))  # the tab keeps the token
        browser.wait(f"{rows} === 3", what="the node table after a reload")
        browser.wait("document.querySelector('#nodes tr[data-node=n3]').className === "
                     "'state-ready'", 30, "n3 ready again")
    assert nodes_of(dump_dom(page.url("n1")))["n3"]["state"] == "ready"
