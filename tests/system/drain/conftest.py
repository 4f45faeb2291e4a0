"""Real 3-node clusters (with the HAProxy front) for the drain tests; a cluster's logs are
printed when a test that used it failed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system.routing.conftest import (
    Cluster,
    _finish,
    _need_plugin,
    _new_run_dir,
    _start,
)


@pytest.fixture
def own_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A 3-node cluster for one test (drains and restarts change it)."""
    _need_plugin()
    failed_before = request.session.testsfailed
    path = _new_run_dir()
    try:
        yield _start(path, 3)
    finally:
        _finish(path, failed=request.session.testsfailed > failed_before)
