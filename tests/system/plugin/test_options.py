"""Plugin options: required secret, validation, custom sidecar id."""

from __future__ import annotations

import pytest

from tests.harness.procs import wait_for
from tests.system.plugin.helpers import SECRET, Broker, Client, ConnectFailed, FakeSidecar


@pytest.mark.parametrize("opts, message", [
    ({"sidecar_secret": None}, "plugin_opt_sidecar_secret is required"),
    ({"auth": "maybe"}, "plugin_opt_auth must be grant or defer"),
    ({"event_window": "0"}, "invalid plugin_opt_event_window"),
    ({"buffer_max_events": "-5"}, "invalid plugin_opt_buffer_max_events"),
    ({"sidecar_socket": "run/m.sock"}, "plugin_opt_sidecar_socket must be the absolute path"),
    ({"message_size_limit": "268435456"}, "invalid plugin_opt_message_size_limit"),
], ids=["no-secret", "bad-auth", "zero-window", "negative-buffer", "relative-socket",
        "size-limit-beyond-mqtt"])
def test_bad_options_stop_mosquitto(procs, plugin_so, opts, message):
    b = Broker(procs, opts=opts)
    try:
        with pytest.raises(RuntimeError):
            b.start(timeout=5)
        wait_for(lambda: not b.alive(), 5, "mosquitto to exit")
        assert message in b.log()
    finally:
        b.cleanup()


def test_custom_sidecar_id(make_broker, clients):
    b = make_broker(opts={"sidecar_id": "node-7-sidecar"})
    # the default id stays reserved (every id beginning with mqfed-sidecar is)
    with pytest.raises(ConnectFailed):
        clients(Client("mqfed-sidecar", port=b.port)).connect()
    c = clients(Client("plain", port=b.port))
    c.connect()
    with pytest.raises(ConnectFailed):
        clients(FakeSidecar(b.sock, client_id="node-7-sidecar", password="nope")).connect()
    sc = clients(FakeSidecar(b.sock, client_id="node-7-sidecar", password=SECRET)).start()
    c.subscribe("x/1")
    ev = sc.wait_type("subscribe", client="plain")
    assert ev and sc.call("stats")["calibration"] == {"session_expiry": "ok"}
