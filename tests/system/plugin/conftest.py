"""Fixtures for the plugin tests: the built plugin, brokers, a fake sidecar, clients."""

from __future__ import annotations

import shutil

import pytest

from tests.system.plugin.helpers import Broker, Client, FakeSidecar, build_plugin


@pytest.fixture(scope="session")
def plugin_so():
    """Build the plugin (make is incremental); a build failure fails the test with make's
    output."""
    try:
        return build_plugin()
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture
def make_broker(procs, plugin_so):
    """`make_broker(**kw)` starts a Broker; all are stopped and their folders removed."""
    brokers: list[Broker] = []

    def _make(**kw) -> Broker:
        b = Broker(procs, name=kw.pop("name", f"mosquitto{len(brokers)}"), **kw)
        brokers.append(b)
        return b.start()

    yield _make
    for b in brokers:
        b.stop()
        shutil.rmtree(b.dir, ignore_errors=True)


@pytest.fixture
def broker(make_broker) -> Broker:
    return make_broker()


@pytest.fixture
def clients():
    """`clients(Client(...))` registers a client to be closed after the test."""
    made: list[Client] = []

    def _reg(c: Client) -> Client:
        made.append(c)
        return c

    yield _reg
    for c in made:
        c.close()


@pytest.fixture
def sidecar(broker, clients) -> FakeSidecar:
    """A connected fake sidecar that streams events from seq 1 and acks them."""
    return clients(FakeSidecar(broker.sock)).start()


@pytest.fixture
def client_factory(broker, clients):
    def _make(client_id: str, **kw) -> Client:
        return clients(Client(client_id, port=broker.port, **kw))

    return _make
