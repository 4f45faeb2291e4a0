"""Fixtures of the peering tests: real `mqfed node` processes (for TLS between nodes)."""

from tests.system.node.conftest import nodes  # noqa: F401
