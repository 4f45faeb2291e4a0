"""Fixtures of the membership tests: real `mqfed node` processes."""

from tests.system.node.conftest import nodes  # noqa: F401 (fixture)
