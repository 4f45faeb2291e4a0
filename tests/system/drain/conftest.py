"""Real 3-node clusters (with the HAProxy front) for the drain tests: the session tests'
`own_cluster` (one cluster per test, its logs printed when the test failed)."""

from __future__ import annotations

from tests.system.sessions.conftest import own_cluster  # noqa: F401 (fixture)
