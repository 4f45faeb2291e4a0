"""Retained-message tests on real clusters (`mqfed up`, or static nodes), reusing the routing
and node fixtures."""

from __future__ import annotations

from tests.system.node.conftest import nodes  # noqa: F401 (fixture)
from tests.system.routing.conftest import cluster_factory, shared_cluster  # noqa: F401 (fixtures)
