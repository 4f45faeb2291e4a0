"""Membership on an etcd that demands credentials: real etcd processes (stopped by PID) with
user/password authentication, and with TLS and client certificates (made by `openssl`);
EtcdMembership with the right `EtcdAccess` registers, watches and survives an etcd restart
(a new session token); wrong or missing credentials fail with a clear error; a real
`mqfed node` configured with membership.etcd_* joins."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import grpc.aio
import pytest
from aetcd import rpc

from sidecar.config import render_toml
from sidecar.devcluster.etcd import find_etcd
from sidecar.membership.etcd import EtcdMembership, EtcdUnavailable, MembershipError
from sidecar.membership.etcd_access import EtcdAccess, EtcdClient
from tests.harness.procs import ProcessGroup, free_port
from tests.system.membership.test_etcd import eventually, record
from tests.system.node.conftest import REPO, node_config
from tests.system.peering.test_tls import make_ca

ETCD = find_etcd()
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(ETCD is None, reason="etcd not installed (apt etcd-server)")]
CLUSTER = "t1"


class SecureEtcd:
    """One etcd member; with `tls` (a make_ca folder) it serves https and demands a client
    certificate signed by that CA."""

    def __init__(self, procs: ProcessGroup, root: Path, tls: Path | None = None) -> None:
        self.procs, self.root, self.tls = procs, root, tls
        self.port, self.peer = free_port(), free_port()
        self.starts = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer}"
        argv = [str(ETCD), "--name", "m0", "--data-dir", str(self.root / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"m0={peer}", "--logger", "zap", "--log-level", "warn"]
        if self.tls:
            argv += ["--cert-file", str(self.tls / "etcd.pem"),
                     "--key-file", str(self.tls / "etcd.key"), "--client-cert-auth",
                     "--trusted-ca-file", str(self.tls / "ca.pem")]
        self.starts += 1
        self.proc = self.procs.start(f"etcd-{self.starts}", argv)
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 15.0) -> None:
        context = None
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.tls / "ca.pem"))
            context.load_cert_chain(str(self.tls / "a.pem"), str(self.tls / "a.key"))
        url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/health"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=1.0, context=context) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"etcd not healthy after {timeout}s")

    def restart(self) -> None:
        self.proc.stop()
        self.start()


async def enable_auth(endpoint: str, tls: EtcdAccess | None = None) -> None:
    """etcd authentication on: root, and a user `mqfed` that may use only /t1/ ."""
    channel = grpc.aio.insecure_channel(endpoint) if tls is None else grpc.aio.secure_channel(
        endpoint, grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert))
    async with channel:
        auth = rpc.AuthStub(channel)
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"))
        await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password="root-pw"))
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name="mqfed"))
        await auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(
            name="mqfed", perm=rpc.Permission(permType=rpc.Permission.READWRITE,
                                               key=f"/{CLUSTER}/".encode(),
                                               range_end=f"/{CLUSTER}0".encode())))
        await auth.UserAdd(rpc.AuthUserAddRequest(name="mqfed", password="s3cret"))
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="mqfed", role="mqfed"))
        await auth.AuthEnable(rpc.AuthEnableRequest())


def member(endpoint: str, node: str, access: EtcdAccess, **kw) -> EtcdMembership:
    return EtcdMembership([endpoint], CLUSTER, record(node), lease_ttl=2, access=access,
                          start_timeout=kw.pop("start_timeout", 10.0), **kw)


def test_user_and_password(procs: ProcessGroup, tmp_path: Path) -> None:
    etcd = SecureEtcd(procs, tmp_path)
    etcd.start()
    asyncio.run(enable_auth(etcd.endpoint))
    good = EtcdAccess(user="mqfed", password="s3cret")

    async def main() -> None:
        a, b = member(etcd.endpoint, "a", good), member(etcd.endpoint, "b", good)
        try:
            await a.start()
            await b.start()
            await eventually(lambda: set(a.peers()) == {"b"}, 5, "a sees b")
            for access, why in ((EtcdAccess(user="mqfed", password="nope"),
                                 "authentication failed"),
                                (EtcdAccess(), "user name is empty"),
                                (EtcdAccess(user="root2", password="x"), "authentication")):
                started = time.monotonic()
                with pytest.raises(MembershipError, match="refused this node") as info:
                    await member(etcd.endpoint, "x", access).start()
                assert why in str(info.value) and "membership.etcd_user" in str(info.value)
                assert time.monotonic() - started < 5  # not retried until start_timeout
            # etcd restarts: its session tokens are gone; the members authenticate again
            etcd.restart()
            c = member(etcd.endpoint, "c", good)
            await c.start()
            await eventually(lambda: set(a.peers()) == {"b", "c"}, 20, "a sees c after")
            await eventually(lambda: a.registered and a.reachable, 10, "a registered")
            await c.stop()
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(main())


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> Path:
    return make_ca(tmp_path_factory.mktemp("etcd-tls") / "ca", ("etcd", "a", "b"))


def _tls(ca: Path, node: str | None) -> EtcdAccess:
    if node is None:
        return EtcdAccess(ca=(ca / "ca.pem").read_bytes())
    return EtcdAccess(ca=(ca / "ca.pem").read_bytes(), cert=(ca / f"{node}.pem").read_bytes(),
                      key=(ca / f"{node}.key").read_bytes())


def test_tls_with_client_certificates(procs: ProcessGroup, tmp_path: Path, ca: Path) -> None:
    etcd = SecureEtcd(procs, tmp_path, tls=ca)
    etcd.start()

    async def main() -> None:
        a = member(etcd.endpoint, "a", _tls(ca, "a"))
        b = member(etcd.endpoint, "b", _tls(ca, "b"))
        try:
            await a.start()
            await b.start()
            await eventually(lambda: set(a.peers()) == {"b"}, 5, "a sees b over TLS")
            assert "TLS with a client certificate" in a.access.describe()
            for access in (_tls(ca, None), EtcdAccess()):  # no certificate; plaintext
                with pytest.raises(EtcdUnavailable):
                    await member(etcd.endpoint, "x", access, start_timeout=2.0).start()
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(main())


def test_a_node_joins_an_etcd_with_tls_and_a_password(procs, tmp_path: Path, ca: Path,
                                                      nodes) -> None:
    etcd = SecureEtcd(procs, tmp_path / "etcd", tls=ca)
    etcd.start()
    asyncio.run(enable_auth(etcd.endpoint, _tls(ca, "a")))
    (tmp_path / "etcd-password").write_text("s3cret\n")
    (tmp_path / "wrong-password").write_text("nope\n")
    membership = {"mode": "etcd", "etcd": [etcd.endpoint], "etcd_ca": str(ca / "ca.pem"),
                  "etcd_cert": str(ca / "a.pem"), "etcd_key": str(ca / "a.key"),
                  "etcd_user": "mqfed", "etcd_password_file": str(tmp_path / "etcd-password")}
    values = node_config(tmp_path, "n1", node={"cluster": CLUSTER}, membership=membership)
    nodes.start(values)  # ready: it registered in etcd before it started Mosquitto

    async def registered() -> bytes | None:
        root = EtcdAccess(ca=_tls(ca, "b").ca, cert=_tls(ca, "b").cert, key=_tls(ca, "b").key,
                          user="root", password="root-pw")
        client = EtcdClient("127.0.0.1", etcd.port, root, timeout=5)
        try:
            kv = await client.get(f"/{CLUSTER}/nodes/n1".encode())
            return None if kv is None else kv.value
        finally:
            await client.close()

    value = asyncio.run(registered())
    assert value is not None and json.loads(value)["node_id"] == "n1"
    wrong = node_config(tmp_path, "n2", node={"cluster": CLUSTER}, membership={
        **membership, "etcd_password_file": str(tmp_path / "wrong-password")})
    path = tmp_path / "n2.toml"
    path.write_text(render_toml(wrong))
    r = subprocess.run([sys.executable, "-m", "sidecar.cli", "node", "--config", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert "refused this node" in r.stderr and "authentication failed" in r.stderr, r.stderr
    assert "nope" not in r.stderr  # the password is never printed
