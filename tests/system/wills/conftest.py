"""Real clusters (`mqfed up`) for the will tests, with a short lease and grace so a killed node
is confirmed dead within a few seconds; a cluster's logs are printed when its test failed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.system.routing.conftest import Cluster, _finish, _need_plugin, _new_run_dir, _start

LEASE_TTL = 3
GRACE = 2.0
ENV = {"MQFED_MEMBERSHIP_LEASE_TTL": str(LEASE_TTL), "MQFED_WILLS_GRACE": str(GRACE),
       "MQFED_LOG_LEVEL": "info"}


@pytest.fixture
def will_cluster(request: pytest.FixtureRequest) -> Iterator:
    """`will_cluster(nodes)` starts a cluster for this test; all are brought down after it."""
    _need_plugin()
    dirs = []
    failed_before = request.session.testsfailed

    def start(nodes: int = 3) -> Cluster:
        dirs.append(_new_run_dir())
        return _start(dirs[-1], nodes, ENV)

    try:
        yield start
    finally:
        for path in dirs:
            _finish(path, failed=request.session.testsfailed > failed_before)
