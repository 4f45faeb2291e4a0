"""Real 3-node clusters (with the HAProxy front) for the drain tests: the session tests'
`own_cluster` (one cluster per test, its logs printed when the test failed), and `mixed`
clusters of several versions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system.drain import versions
from tests.system.drain.versions import MixedCluster
from tests.system.sessions.conftest import own_cluster  # noqa: F401 (fixture)


@pytest.fixture
def mixed(request: pytest.FixtureRequest) -> Iterator[MixedCluster]:
    """A cluster whose nodes may run different versions (tests/system/drain/versions.py)."""
    with versions.mixed_cluster(request) as cluster:
        yield cluster
