"""Mutual TLS on peer streams (grpc.tls_cert / tls_key / tls_ca), with certificates made by the
real `openssl` tool: nodes of one CA mesh, in process and as real `mqfed node` processes; a
plaintext dialler or a certificate of another CA gets no stream, and the TLS failure is
reported as a refusal naming the settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config import render_toml
from sidecar.peering.handshake import RefuseCode
from sidecar.peering.tls import PeerTls
from tests.system.node.conftest import REPO, node_config, pair_static
from tests.system.peering.test_transport import addr, all_connected, connect, run, until
from tests.system.peering.test_transport import nodes as transports


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, nodes_: tuple[str, ...]) -> Path:
    """A CA and, per node, a certificate naming 127.0.0.1 and localhost, in `folder`."""
    folder.mkdir(parents=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-days", "2", "-subj", f"/CN={folder.name}-ca",
             "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem"))
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n")
    for node in nodes_:
        _openssl("req", *ec, "-subj", f"/CN={node}", "-keyout", str(folder / f"{node}.key"),
                 "-out", str(folder / f"{node}.csr"))
        _openssl("x509", "-req", "-in", str(folder / f"{node}.csr"), "-CA",
                 str(folder / "ca.pem"), "-CAkey", str(folder / "ca.key"), "-CAcreateserial",
                 "-days", "2", "-out", str(folder / f"{node}.pem"), "-extfile", str(ext))
    return folder


def tls_of(folder: Path, node: str) -> PeerTls:
    return PeerTls((folder / f"{node}.pem").read_bytes(), (folder / f"{node}.key").read_bytes(),
                   (folder / "ca.pem").read_bytes())


@pytest.fixture(scope="module")
def cas(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tls")
    return make_ca(root / "one", ("a", "b")), make_ca(root / "two", ("a",))


def test_nodes_of_one_ca_mesh_and_others_get_no_stream(cas):
    one, two = cas

    async def body():
        async with transports() as n:
            a, ra = await n.start("a", tls=tls_of(one, "a"), token="t")
            b, rb = await n.start("b", tls=tls_of(one, "b"), token="t")
            connect(a, b)
            await until(all_connected(a, b), 10, "a and b over TLS")
            a.send("b", b"")  # an empty Frame: frames still flow over the TLS stream
            x, rx = await n.start("x", token="t")  # plaintext, right token
            y, ry = await n.start("y", tls=tls_of(two, "a"), token="t")  # another CA
            x.set_peers({"a": addr(a)})
            y.set_peers({"a": addr(a)})
            await until(lambda: ry.refusals, 10, "y's TLS handshake refused")
            peer, refuse = ry.refusals[0]
            assert peer == "a" and refuse.code == RefuseCode.UNAUTHENTICATED
            assert "TLS handshake" in refuse.message and "grpc.tls_ca" in refuse.message
            await until(lambda: x.states()["a"]["failures"] >= 1, 10, "x's dial failed")
            assert not x.connected("a") and not y.connected("a")
            assert not a.connected("x", inbound=True) and not a.connected("y", inbound=True)
            assert a.connected("b") and b.connected("a")

    run(body())


def test_real_nodes_mesh_over_tls_and_a_missing_file_starts_nothing(nodes, tmp_path, cas):
    one, _ = cas
    values = {}
    for node in ("a", "b"):
        values[node] = node_config(tmp_path, node, admin={"dev_mode": True}, grpc={
            "tls_cert": str(one / f"{node}.pem"), "tls_key": str(one / f"{node}.key"),
            "tls_ca": str(one / "ca.pem")})
    pair_static(values)
    nodes.start(values["a"])
    b = nodes.start(values["b"])
    b.wait(lambda s: all((s.get("routing") or {}).get("peers", {}).get("a", {}).get(
        d, {}).get("state") == "up" for d in ("outbound", "inbound")),
        "b's streams with a up over TLS", timeout=20)

    bad = node_config(tmp_path, "c", grpc={"tls_cert": str(one / "a.pem"),
                                           "tls_key": str(one / "a.key"),
                                           "tls_ca": str(tmp_path / "missing-ca.pem")})
    path = tmp_path / "c.toml"
    path.write_text(render_toml(bad))
    r = subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "cannot read grpc.tls_ca" in r.stderr, r.stderr
    assert not (tmp_path / "c" / "mosquitto.pid").exists()


def test_admin_calls_over_tls_reach_every_node(nodes, tmp_path, cas):
    """With admin.tls, `mqfed ctl --tls-ca` gets a cluster-wide answer (the node asks the
    other over TLS too); a plaintext call cannot get through and exits 3 naming the node."""
    one, _ = cas
    values = {node: node_config(tmp_path, node, admin={"token": "t0ken", "tls": True}, grpc={
        "tls_cert": str(one / f"{node}.pem"), "tls_key": str(one / f"{node}.key"),
        "tls_ca": str(one / "ca.pem")}) for node in ("a", "b")}
    pair_static(values)
    nodes.start(values["a"])
    b = nodes.start(values["b"])
    b.wait(lambda s: (s.get("routing") or {}).get("peers", {}).get("a", {}).get(
        "outbound", {}).get("state") == "up", "b's stream to a up", timeout=20)
    admin = values["a"]["admin"]["listen"]
    env = {"PATH": "/usr/bin:/bin", "MQFED_ADMIN_TOKEN": "t0ken"}

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sidecar.cli", "ctl", "--node", admin,
                               *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                              env=env)

    r = ctl("--tls-ca", str(one / "ca.pem"), "--json", "clients")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["missing"] == []
    r = ctl("--json", "clients")
    assert r.returncode == 3 and f"node {admin}" in r.stderr, r.stderr
