"""Real 3-node clusters (with the HAProxy front) for the session tests; a cluster's logs are
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


def _cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    _need_plugin()
    failed_before = request.session.testsfailed
    path = _new_run_dir()
    try:
        yield _start(path, 3)
    finally:
        _finish(path, failed=request.session.testsfailed > failed_before)


@pytest.fixture(scope="module")
def shared_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """One cluster for a module of small independent checks."""
    yield from _cluster(request)


@pytest.fixture
def own_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A cluster for one test that changes it (kills, adds nodes)."""
    yield from _cluster(request)
