"""Parsing a node's Prometheus /metrics text in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def parse_metrics(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample: (name, sorted (label, value) pairs) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
