"""The metric names a PromQL expression reads, and the expressions of the shipped monitoring
files (deploy/prometheus/alerts.yml, deploy/grafana/mqfed.json), for tests that check them
against what a node's /metrics really exports.

A small tokenizer, not a parser: strings, label matchers (`{...}`), range and subquery
brackets (`[...]`), grouping label lists (`by (...)`, `on (...)`, ...) and Grafana variables
(`$node`, `${node}`) are removed; every identifier left that is not a function (followed by
`(`), an aggregation, a keyword or a number is a metric name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

__all__ = ["alert_expressions", "dashboard_expressions", "metric_names", "series_names"]

# words that are never metric names where they stand (functions are recognised by their `(`)
KEYWORDS = frozenset({
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
    "group_right", "inf", "nan", "atan2",
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENT = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")
_LABEL_VALUES = re.compile(r"\s*label_values\(\s*(.+?)\s*,\s*\w+\s*\)\s*$", re.S)
_NUMBER_WORD = re.compile(r"(?i)(?:0x[0-9a-f]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?[smhdwy]*)$")


def _blank(pattern: re.Pattern[str], text: str) -> str:
    return pattern.sub(" ", text)


def _strip_brackets(text: str, open_: str, close: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == open_:
            depth += 1
            out.append(" ")
        elif ch == close and depth:
            depth -= 1
            out.append(" ")
        else:
            out.append(" " if depth else ch)
    return "".join(out)


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects, e.g. {"mqfed_ready"} for `sum(mqfed_ready{node="n1"})`.

    Raises ValueError on brackets that do not balance."""
    for open_, close in ("()", "{}", "[]"):
        if expr.count(open_) != expr.count(close):
            raise ValueError(f"unbalanced {open_}{close} in PromQL: {expr!r}")
    text = _blank(_STRING, expr)
    text = _strip_brackets(text, "{", "}")
    text = _strip_brackets(text, "[", "]")
    text = _blank(_VARIABLE, text)
    text = _blank(_GROUPING, text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group()
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS or _NUMBER_WORD.match(word):
            continue
        names.add(word)
    return names


def series_names(scrape: str) -> set[str]:
    """The series names of a Prometheus text exposition (histograms: `_bucket`, `_sum`,
    `_count`; counters: `_total`), i.e. the names PromQL can select."""
    names = set()
    for line in scrape.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def alert_expressions(path: Path) -> dict[str, str]:
    """Alert (or recording rule) name -> expression, of a Prometheus rules file."""
    doc = yaml.safe_load(path.read_text())
    out = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            out[rule.get("alert") or rule["record"]] = rule["expr"]
    return out


def dashboard_expressions(path: Path) -> dict[str, str]:
    """"panel title #refId" -> expression, of every query of a Grafana dashboard (rows'
    nested panels included), plus the templating variables' queries ("$name")."""
    doc = json.loads(path.read_text())
    out = {}

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                out[f"{panel['title']} #{target['refId']}"] = target["expr"]
            walk(panel.get("panels", []))

    walk(doc["panels"])
    for var in doc.get("templating", {}).get("list", []):
        if var["type"] == "query":
            query = var["query"]
            query = query["query"] if isinstance(query, dict) else query
            # Grafana's label_values(SELECTOR, LABEL): only the selector is PromQL
            values = _LABEL_VALUES.match(query)
            out[f"${var['name']}"] = values.group(1) if values else query
    return out
