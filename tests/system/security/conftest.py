"""Attacks on a real Mosquitto with the mqfed plugin (issue 16), reusing the plugin and node
fixtures."""

from __future__ import annotations

from tests.system.node.conftest import nodes  # noqa: F401 (fixture)
from tests.system.plugin.conftest import (  # noqa: F401 (fixtures)
    broker,
    client_factory,
    clients,
    make_broker,
    plugin_so,
    sidecar,
)
