"""The Grafana dashboard's shape (deploy/grafana/mqfed.json): a data source variable every
query uses, a `node` variable every query filters by, unique panel ids, panels that do not
overlap, and the sections issue 22 asks for. Its metric names: test_metric_names.py."""

from __future__ import annotations

import json
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "mqfed.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(doc: dict) -> list[dict]:
    out = []
    for panel in doc["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def test_variables() -> None:
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    node = variables["node"]
    assert node["type"] == "query" and node["multi"] and node["includeAll"]
    assert node["datasource"] == DATASOURCE


def test_every_query_uses_the_variables() -> None:
    queried = [p for p in panels(load()) if p["type"] != "row"]
    assert queried
    for panel in queried:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert 'node=~"$node"' in target["expr"], (panel["title"], target["expr"])


def test_ids_are_unique_and_panels_do_not_overlap() -> None:
    all_panels = panels(load())
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in all_panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_the_sections_of_issue_22() -> None:
    rows = [p["title"] for p in load()["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Throughput", "Latency", "Backlog and shedding", "Peer streams",
                    "Sessions", "Resources"]
