"""A real 3-node cluster (with the HAProxy front) shared by the session tests; its logs are
printed when one of them failed."""

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


@pytest.fixture(scope="module")
def shared_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    _need_plugin()
    failed_before = request.session.testsfailed
    path = _new_run_dir()
    try:
        yield _start(path, 3)
    finally:
        _finish(path, failed=request.session.testsfailed > failed_before)


@pytest.fixture
def own_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A 3-node cluster for one test that changes it (kills, adds nodes)."""
    _need_plugin()
    failed_before = request.session.testsfailed
    path = _new_run_dir()
    try:
        yield _start(path, 3)
    finally:
        _finish(path, failed=request.session.testsfailed > failed_before)
