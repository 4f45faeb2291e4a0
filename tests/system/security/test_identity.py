"""The sidecar's identities cannot be borrowed on a listener where Mosquitto asks no plugin
(issue 16): a TLS listener with `use_identity_as_username` (any valid certificate) or a PSK
listener. A client using the sidecar's client id or username there gets no cluster traffic,
cannot drive the plugin, and is disconnected at its first packet; only the secret on the
private unix socket proves the identity.

Mosquitto hands such a connection the session of its client id before any plugin callback (a
takeover): the generated config's sidecar id is derived from the node's secret so that nobody
can name it (`sidecar_client_id`; the node test shows the real sidecar untouched)."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.harness.procs import free_port
from tests.system.plugin.helpers import (
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    Broker,
    Client,
    ConnectFailed,
    FakeSidecar,
)
from tests.system.security.certs import make_certs
from tests.system.security.clients import TlsClient

FWD_ID = SIDECAR_ID + ".fwd"


def tls_listener(port: int, certs) -> str:
    return (f"listener {port} 127.0.0.1\ncafile {certs}/ca.pem\ncertfile {certs}/server.pem\n"
            f"keyfile {certs}/server.key\nrequire_certificate true\n"
            "use_identity_as_username true\n")


def test_certificate_client_cannot_use_the_sidecar_identity(make_broker, clients,
                                                             readable_dir):
    certs = make_certs(readable_dir, ("server", "alice", SIDECAR_USER))
    tls_port = free_port()
    b = make_broker(tcp_extra=tls_listener(tls_port, certs))
    sc = clients(FakeSidecar(b.sock)).start()
    fwd = clients(Client(FWD_ID, sock=b.sock, username=SIDECAR_USER, password=SECRET,
                         clean_start=False, session_expiry=3600))
    fwd.connect()
    fwd.subscribe("a/#", 1)
    pub = clients(Client("pub", port=b.port))
    pub.connect()
    # a certificate with CN=alice as each sidecar id; CN=mqfed-sidecar (the sidecar's
    # username) as another client id (a shadow without the secret)
    for n, (cid, cert) in enumerate([(FWD_ID, "alice"), (SIDECAR_ID, "alice"),
                                     ("bob", SIDECAR_USER)]):
        att = clients(TlsClient(cid, tls_port, certs, cert, clean_start=False,
                                session_expiry=3600))
        att.connect()  # Mosquitto asks no plugin before this
        pub.publish("a/x", f"m{n}".encode())
        time.sleep(0.3)
        assert att.messages == [], cid  # no cluster traffic, not even the session's queue
        # its first packet disconnects it: a command, or a subscription
        att.send("$CONTROL/mqfed/v1", b'{"v":1,"id":"x","reply":"$SYS/broker/mqfed/replies/x",'
                 b'"cmd":"deny","client":"pub","mode":"refuse"}')
        assert att.wait_disconnected(5), cid
        assert att.messages == [], cid
    spy = clients(TlsClient("carol", tls_port, certs, SIDECAR_USER))
    spy.connect()
    spy.c.subscribe("a/#", 1)
    assert spy.wait_disconnected(5)
    assert spy.messages == []
    # Mosquitto's takeover did close the real connections here (this broker uses the
    # default, guessable id); the identity is still the sidecar's: it reconnects and resumes,
    # and the impostor's command was never carried out
    assert sc.disconnected
    sc2 = clients(FakeSidecar(b.sock)).continue_from(sc)
    sc2.connect()
    assert sc2.call("stats")["denied"] == 0
    fwd2 = clients(Client(FWD_ID, sock=b.sock, username=SIDECAR_USER, password=SECRET,
                          clean_start=False, session_expiry=3600))
    fwd2.connect()
    fwd2.subscribe("a/#", 1)
    pub.publish("a/after", b"ok")
    assert [m.payload for m in fwd2.wait_messages(lambda m: m.topic == "a/after")] == [b"ok"]
    warnings = [line for line in b.log().splitlines() if "without having proven it" in line]
    assert 1 <= len(warnings) <= 2, warnings  # rate-limited: not one per refusal


def test_psk_identity_cannot_use_the_sidecar_identity(make_broker, clients, readable_dir):
    psk_file = readable_dir / "psk"
    psk_file.write_text(f"{SIDECAR_USER}:1f2e3d4c\n")
    psk_file.chmod(0o644)
    psk_port = free_port()
    b = make_broker(extra=f"psk_file {psk_file}", tcp_extra=(
        f"listener {psk_port} 127.0.0.1\npsk_hint mqfed-test\nuse_identity_as_username true\n"
        "tls_version tlsv1.2\n"))
    sc = clients(FakeSidecar(b.sock)).start()
    pub = clients(Client("pub", port=b.port))
    pub.connect()
    # the PSK identity is the sidecar's username; the client id the forwarding connection's
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(psk_port), "--psk", "1f2e3d4c",
         "--psk-identity", SIDECAR_USER, "--tls-version", "tlsv1.2", "-i", FWD_ID, "-t", "#",
         "-t", "$SYS/broker/mqfed/#", "-v", "-W", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(0.5)
        pub.publish("a/x", b"secret")
        out, _ = sub.communicate(timeout=10)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert "secret" not in out and "mqfed" not in out.replace("mqfed-test", ""), out
    assert "without having proven it" in b.log()
    assert not sc.disconnected  # its client id was not the sidecar's own
    assert sc.call("stats")["ok"] is True


def test_sidecar_credentials_count_only_on_the_private_socket(procs, plugin_so, clients):
    b = Broker(procs)
    public = f"{b.dir}/public.sock"
    b.opts["sidecar_socket"] = b.sock
    b.tcp_extra = f"listener 0 {public}"
    try:
        b.start()
        sc = clients(FakeSidecar(b.sock)).start()
        # the right secret on TCP, or on another unix socket, proves nothing
        for cid in (SIDECAR_ID, FWD_ID, "shadow-of-c"):
            for where in ({"port": b.port}, {"sock": public}):
                with pytest.raises(ConnectFailed) as refused:
                    clients(Client(cid, username=SIDECAR_USER, password=SECRET,
                                   **where)).connect()
                assert refused.value.reason == 135, (cid, where)
        # other ids beginning with mqfed-sidecar are reserved too
        with pytest.raises(ConnectFailed):
            clients(Client(SIDECAR_ID + "-x", port=b.port)).connect()
        assert not sc.disconnected and sc.call("stats")["ok"] is True
        rejected = sc.wait_type("connect_rejected", count=7)
        assert {e["reason"] for e in rejected} == {"auth"}
        assert "accepted only on its private unix-socket listener" in b.log()
    finally:
        b.cleanup()
