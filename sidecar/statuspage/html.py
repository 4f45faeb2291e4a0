"""The status page's HTML (sans-IO): its sections rendered on the server from the dicts of
`model`, so the page shows the cluster without JavaScript; the page's script fetches the same
sections again from /status.json every 1.5 s. The page itself is `page.html` (read by
`pages`)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from html import escape
from typing import Any

__all__ = ["links_html", "nodes_html", "page", "routes_html", "script_hash",
           "summary_html"]

DASH = "–"


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def rate(value: float | None) -> str:
    """Messages per second for display (– while not known)."""
    if value is None:
        return DASH
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _short(text: str, limit: int = 140) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[str], cls: str, empty: str) -> str:
    if not rows:
        return f'<p class="empty">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _cells(values: Sequence[Any], numeric_from: int) -> str:
    return "".join(f'<td class="num">{_e(v)}</td>' if i >= numeric_from else f"<td>{_e(v)}</td>"
                   for i, v in enumerate(values))


def nodes_html(nodes: Sequence[dict[str, Any]]) -> str:
    """One row per node: its state (the row is classed state-<state>), clients, sessions,
    retained messages, message rates (counters in the cells' titles), overload shedding."""
    rows = []
    for n in nodes:
        me = ' <small>(this node)</small>' if n["self"] else ""
        state = (f'<td class="state" title="{_e(n["why"])}"><span class="dot"></span>'
                 f'{_e(n["state"])}</td>')
        if "ready" in n:
            rates = "".join(
                f'<td class="num" data-rate="{key}" data-total="{_e(n[total])}" '
                f'title="{_e(n[total])} in all">{rate(n["rate_" + key])}</td>'
                for key, total in (("out", "forwarded"), ("in", "received"),
                                   ("delivered", "delivered")))
            shed = (f'<td class="shed">SHEDDING ({_e(n["publishers_shed"])} shed)</td>'
                    if n["shedding"] else f'<td>no ({_e(n["publishers_shed"])} shed)</td>')
            rest = (_cells([n["version"], n["uptime"], n["etcd"],
                            f'{n["clients_online"]} / {n["clients_offline"]}',
                            n["subscriptions"], f'{n["sessions"]} / {n["sessions_owned"]}',
                            n["retained"]], 3)
                    + rates + f'<td class="num">{_e(n["backlog"])}</td>{shed}')
        else:
            rest = f'<td colspan="12" class="why">{_e(_short(n["why"]))}</td>'
        rows.append(f'<tr class="state-{_e(n["state"])}" data-node="{_e(n["id"])}">'
                    f'<td class="node">{_e(n["id"])}{me}</td>{state}{rest}'
                    f'<td class="addr">{_e(n["mqtt"])}</td></tr>')
    return _table(["node", "state", "version", "uptime", "etcd", "clients on / off",
                   "subscriptions", "sessions / owned", "retained", "out msg/s", "in msg/s",
                   "delivered msg/s", "backlog", "overload shedding", "MQTT"], rows, "nodes",
                  "no node known")


def links_html(nodes: Sequence[dict[str, Any]], links: Sequence[dict[str, Any]]) -> str:
    """The peer stream matrix: row FROM, column TO, as FROM sees its two streams with TO
    (nodes that left are not in it)."""
    ids = [n["id"] for n in nodes if n["state"] != "left"]
    by_pair = {(x["from"], x["to"]): x for x in links}
    reporting = {x["from"] for x in links} | {n["id"] for n in nodes if "ready" in n}
    rows = []
    for src in ids:
        if src not in reporting:
            rows.append(f'<tr><th>{_e(src)}</th><td colspan="{len(ids)}" class="unknown">'
                        'no answer</td></tr>')
            continue
        cells = []
        for dst in ids:
            x = by_pair.get((src, dst))
            if src == dst:
                cells.append('<td class="self">·</td>')
            elif x is None:
                cells.append('<td class="unknown">no stream</td>')
            else:
                err = f' title="{_e(x["last_error"])}"' if x["last_error"] else ""
                cells.append(
                    f'<td class="link link-{_e(x["state"])}" data-from="{_e(src)}" '
                    f'data-to="{_e(dst)}" data-sent="{_e(x["sent"])}"{err}><b>{_e(x["state"])}</b> '
                    f'<span>out {_e(x["outbound"])} · in {_e(x["inbound"])}</span>'
                    f'<span>{rate(x["rate"])} msg/s · sent {_e(x["sent"])}</span>'
                    f'<span>queued {_e(x["queued"])} · reconnects {_e(x["reconnects"])}'
                    f'{" · draining" if x["draining"] else ""}</span></td>')
        rows.append(f'<tr><th>{_e(src)}</th>{"".join(cells)}</tr>')
    head = "".join(f"<th>to {_e(i)}</th>" for i in ids)
    return (f'<table class="links"><thead><tr><th>from</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>') if ids else '<p class="empty">-</p>'


def summary_html(data: dict[str, Any]) -> str:
    """Cluster totals and the nodes that did not answer."""
    t = data["totals"]
    shedding = ", ".join(t["shedding"]) or "none"
    items = [("nodes ready", f'{t["ready"]} of {t["nodes"]}'), ("nodes down", t["down"]),
             ("clients online", t["clients"]), ("sessions", t["sessions"]),
             ("retained messages", t["retained"]), ("publishes out msg/s", rate(t["rate_out"])),
             ("received msg/s", rate(t["rate_in"])), ("overload shedding", shedding)]
    cards = "".join(f'<div class="card{" bad" if k == "nodes down" and v else ""}'
                    f'{" bad" if k == "overload shedding" and v != "none" else ""}">'
                    f'<span>{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in items)
    missing = "".join(f'<li>{_e(m["node"])} ({_e(m["address"] or "no admin address")}): '
                      f'{_e(m["error"])}</li>' for m in data["missing"])
    if missing:
        missing = f'<div class="missing">partial answer: no answer from<ul>{missing}</ul></div>'
    return f'<div class="cards">{cards}</div>{missing}'


def routes_html(data: dict[str, Any]) -> str:
    """Routes for one topic: the nodes that deliver it, then every route."""
    rows = []
    for r in data["routes"]:
        subscribers = "" if r["subscribers"] is None else r["subscribers"]
        cells = _cells([r["from"], r["to"], r["filter"], r["group"], subscribers], 4)
        rows.append(f'<tr data-from="{_e(r["from"])}" data-to="{_e(r["to"])}">{cells}</tr>')
    nodes = ", ".join(data["delivered_by"]) or "no node"
    head = (f'<p class="delivered">a message on <code>{_e(data["topic"])}</code> is delivered'
            f' by: <b id="delivered-by">{_e(nodes)}</b></p>')
    missing = "; ".join(f'{m["node"]}: {m["error"]}' for m in data["missing"])
    if missing:
        head += f'<p class="missing">partial answer: no answer from {_e(missing)}</p>'
    return head + _table(["from", "to", "filter", "share group", "local subscribers"], rows,
                         "routes", "no route: no node has a matching subscription")


def script_hash(template: str) -> str:
    """The CSP hash of the page's inline script."""
    match = re.search(r"<script>(.*?)</script>", template, re.S)
    assert match is not None, "page.html has no script"
    digest = hashlib.sha256(match.group(1).encode()).digest()
    return "sha256-" + base64.b64encode(digest).decode()


def page(template: str, cluster: str, node: str, sections: dict[str, str], topic: str,
         signed_in: bool, note: str = "") -> str:
    """The whole page (`template`: page.html): `sections` (summary, nodes, links, routes)
    rendered in place."""
    fills = {"CLUSTER": _e(cluster), "NODE": _e(node), "TOPIC": _e(topic), "NOTE": _e(note),
             "SIGNED_IN": "1" if signed_in else "0", "LOGIN_HIDDEN": "hidden" if signed_in else ""}
    fills.update({k.upper(): v for k, v in sections.items()})
    return re.sub(r"\{\{([A-Z_]+)\}\}", lambda m: fills.get(m.group(1), ""), template)
