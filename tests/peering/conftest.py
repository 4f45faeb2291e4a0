"""Fixtures of the peering tests: real `mqfed node` processes (for TLS between nodes)."""

from tests.node.conftest import nodes  # noqa: F401
