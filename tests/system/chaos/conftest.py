"""One 3-node loopback cluster for the chaos scenarios of a module, always brought down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system.routing.conftest import Cluster, _finish, _need_plugin, _new_run_dir, _start


@pytest.fixture(scope="module")
def chaos_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    _need_plugin()
    path = _new_run_dir()
    failed = True
    try:
        yield _start(path, 3)
        failed = request.session.testsfailed > 0
    finally:
        _finish(path, failed=failed)
