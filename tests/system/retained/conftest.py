"""Retained-message tests on real clusters (`mqfed up`), reusing the routing fixtures."""

from __future__ import annotations

from tests.system.routing.conftest import cluster_factory, shared_cluster  # noqa: F401 (fixtures)
