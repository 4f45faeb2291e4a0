"""Attacks on a real 2-node cluster (`mqfed up`: etcd, Mosquitto with the plugin, sidecars,
random peer and admin tokens), each shown to do no harm:

- a membership record written to etcd that points at an impostor gets no token from any node,
  nor from `mqfed ctl` or the admin fan-out (challenge-response: the token never travels),
  and what the impostor records is worthless at the real nodes;
- unauthenticated callers sending oversized messages to the peer and admin ports do not grow
  the sidecar's memory: calls are refused before their messages are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import stat
import time
from pathlib import Path

import aetcd
import grpc
import grpc.aio
import pytest

from sidecar._proto import peer_pb2
from sidecar.admin.wire import path as admin_path
from sidecar.membership.view import NodeRecord
from sidecar.peering import wire
from tests.harness.procs import wait_for
from tests.system.admin.conftest import AdminCluster
from tests.system.cluster.conftest import mqfed
from tests.system.security.fake import FakeNode

pytestmark = pytest.mark.timeout(240)

MB = 1 << 20


def _etcd(cluster: AdminCluster) -> tuple[str, int]:
    host, _, port = cluster.info["etcd"][0].rpartition(":")
    return host, int(port)


def _credentials(cluster: AdminCluster) -> dict[str, str]:
    """The etcd user of the nodes: `mqfed up` runs etcd with authentication on."""
    password = Path(cluster.info["etcd_password_file"]).read_text().strip()
    return {"username": cluster.info["etcd_user"], "password": password}


def _put(cluster: AdminCluster, key: str, value: bytes | None) -> None:
    """Write (None: delete) `key` as the nodes' etcd user: whoever can write to etcd."""
    async def go() -> None:
        host, port = _etcd(cluster)
        async with aetcd.Client(host, port, timeout=5, **_credentials(cluster)) as client:
            if value is None:
                await client.delete(key.encode())
            else:
                await client.put(key.encode(), value)
    asyncio.run(go())


def _token(cluster: AdminCluster, name: str) -> bytes:
    return (cluster.run_dir / name).read_text().strip().encode()


def test_the_dev_etcd_refuses_clients_without_credentials(cluster: AdminCluster) -> None:
    """`mqfed up`'s etcd has authentication on: without the run dir's password nobody reads
    or writes the membership, while the nodes (user `mqfed`) keep theirs."""
    prefix = f"/{cluster.info['cluster']}/nodes/".encode()
    password_file = Path(cluster.info["etcd_password_file"])
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600

    async def go(**credentials: str) -> tuple[list[str], list[str]]:
        """What succeeded and what was refused (and how)."""
        host, port = _etcd(cluster)
        done: list[str] = []
        refused: list[str] = []
        try:
            async with aetcd.Client(host, port, timeout=5, **credentials) as client:
                for name, attempt in (
                        ("read", lambda: client.get_prefix(prefix)),
                        ("write", lambda: client.put(prefix + b"intruder", b"{}")),
                        ("delete", lambda: client.delete(prefix + b"n1"))):
                    try:
                        await attempt()
                        done.append(name)
                    except aetcd.exceptions.ClientError as exc:
                        refused.append(f"{name}: {type(exc).__name__}: {exc}"[:120])
        except aetcd.exceptions.ClientError as exc:
            refused.append(f"connect: {type(exc).__name__}: {exc}"[:120])
        return done, refused

    done, refused = asyncio.run(go())
    assert done == [] and len(refused) == 3, (done, refused)
    done, wrong = asyncio.run(go(username="mqfed", password="guess"))
    assert done == [] and wrong, (done, wrong)

    async def registered() -> list[bytes]:
        host, port = _etcd(cluster)
        async with aetcd.Client(host, port, timeout=5, **_credentials(cluster)) as client:
            return sorted(kv.key for kv in await client.get_prefix(prefix))

    assert asyncio.run(registered()) == [prefix + b"n1", prefix + b"n2"]
    status = cluster.ctl("--json", "status", "--node", "n1", "--node", "n2")
    assert status.code == 0, status.err
    print(f"refused without credentials: {refused}; with a wrong password: {wrong}")


def test_a_forged_membership_record_gets_no_token(cluster: AdminCluster) -> None:
    fake_peer, fake_admin = FakeNode().start(), FakeNode().start()
    key = f"/{cluster.info['cluster']}/nodes/evil"
    record = NodeRecord("evil", fake_peer.address, "127.0.0.1:1", "9.9", 1, time.time(),
                        admin=fake_admin.address)
    try:
        _put(cluster, key, record.encode())

        def dialled_by() -> set[str]:
            return {c.metadata.get("mqfed-auth-caller", "?") for c in fake_peer.snapshot()
                    if c.method == wire.METHOD}

        wait_for(lambda: dialled_by() == {"n1", "n2"}, 15, "both nodes dialling the impostor")
        # the admin fan-out asks the impostor too, and ignores its unproven answer
        fanned = cluster.ctl("--json", "status")
        assert fanned.code == 4, fanned.err  # partial: "evil" is missing
        missing = {m["node_id"]: m["error"] for m in fanned.json()["missing"]}
        assert "did not prove that it holds the admin token" in missing["evil"], missing
        # `mqfed ctl` pointed at the impostor directly refuses its answer
        direct = mqfed("ctl", "--node", fake_admin.address, "--token-file",
                       cluster.token_file, "nodes", timeout=60,
                       env={"MQFED_ADMIN_TOKEN": "", "MQFED_ADMIN_TOKEN_FILE": ""})
        assert direct.returncode == 1 and "did not prove" in direct.stderr, direct.stderr
        time.sleep(1.0)
        tokens = (_token(cluster, "peer-token"), _token(cluster, "admin-token"))
        for fake in (fake_peer, fake_admin):
            received = fake.everything()
            assert received and not any(token in received for token in tokens)
            assert not any("authorization" in c.metadata for c in fake.snapshot())
        streams = [c for c in fake_peer.snapshot() if c.method == wire.METHOD]
        for call in streams:  # a proof naming the impostor, then nothing: no Hello, no frame
            assert call.messages == []
            assert (call.metadata["mqfed-auth-callee"], call.metadata["mqfed-auth-address"]) \
                == ("evil", fake_peer.address)
        asked = [c for c in fake_admin.snapshot() if c.method == admin_path("Status")]
        assert asked and all(c.metadata["mqfed-auth-callee"] == "evil" for c in asked
                             if c.metadata.get("mqfed-auth-caller"))
        # what the impostor recorded opens nothing at a real node (a relay or a replay)
        assert _replay(cluster.nodes["n2"]["grpc"], streams[-1].metadata) \
            == grpc.StatusCode.UNAUTHENTICATED
        log = (cluster.run_dir / "nodes" / "n1" / "node.log").read_text()
        assert "did not prove that it holds the peer token" in log
        # the real peers are still meshed
        status = cluster.ctl("--json", "status", "--node", "n1", "--node", "n2")
        assert status.code == 0, status.err
        links = {(s["node_id"], p["peer"]): p for s in status.json()["statuses"]
                 for p in s["peers"]}
        assert links[("n1", "n2")]["outbound"] == "up" and links[("n2", "n1")]["outbound"] == "up"
    finally:
        _put(cluster, key, None)
        fake_peer.stop()
        fake_admin.stop()


def _replay(address: str, metadata: dict[str, str]) -> grpc.StatusCode:
    async def go() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.stream_stream(wire.METHOD)(metadata=tuple(
                (k, v) for k, v in metadata.items() if k.startswith("mqfed-auth-")))
            await call.initial_metadata()
            return await call.code()
    return asyncio.run(go())


def _high_water_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


async def _flood(peer: str, admin: str, calls: int, size: int) -> list[str]:
    """`calls` concurrent unauthenticated calls, each sending `size` bytes: peer streams
    (a huge first frame), Challenge calls and admin calls with huge requests."""
    big = b"\x0a" + b"x" * size  # not even a valid frame: it must not be parsed at all
    options = [("grpc.max_send_message_length", -1), ("grpc.enable_http_proxy", 0)]

    async def stream(channel: grpc.aio.Channel) -> str:
        call = channel.stream_stream(wire.METHOD)()
        writing = asyncio.ensure_future(call.write(big))
        with contextlib.suppress(grpc.aio.AioRpcError):  # the Refuse, while the frame goes out
            frames = [peer_pb2.Frame.FromString(data) async for data in call]
            assert [f.WhichOneof("body") for f in frames] == ["refuse"]
        await asyncio.gather(writing, return_exceptions=True)
        return (await call.code()).name

    async def unary(channel: grpc.aio.Channel, method: str) -> str:
        try:
            await channel.unary_unary(method)(big, timeout=30)
            return "OK"
        except grpc.aio.AioRpcError as exc:
            return exc.code().name

    async with grpc.aio.insecure_channel(peer, options=options) as p, \
            grpc.aio.insecure_channel(admin, options=options) as a:
        kinds = [lambda: stream(p), lambda: unary(p, wire.CHALLENGE),
                 lambda: unary(a, admin_path("Status")), lambda: unary(a, admin_path("Challenge"))]
        return list(await asyncio.gather(*(kinds[i % 4]() for i in range(calls))))


def test_unauthenticated_oversized_calls_do_not_grow_the_sidecar(cluster: AdminCluster) -> None:
    node = cluster.nodes["n1"]
    pid = node["pid"]
    before = _high_water_mb(pid)
    codes = asyncio.run(_flood(node["grpc"], node["admin"], calls=16, size=24 * MB))
    after = _high_water_mb(pid)
    print(f"sidecar VmHWM {before:.0f} MB -> {after:.0f} MB after 16 x 24 MiB calls: {codes}")
    refused = {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED"}
    assert all(c.split(":")[0] in refused for c in codes[0::4] + codes[2::4]), codes
    assert after - before < 30, f"the sidecar grew from {before:.0f} MB to {after:.0f} MB"
    status = cluster.ctl("--json", "status", "--node", "n1")
    assert status.code == 0 and json.loads(status.out)["statuses"][0]["node_id"] == "n1"


def test_the_cluster_files_are_private(cluster: AdminCluster) -> None:
    """Data files hold payloads, logs and status files what clients do, configs secrets: none
    is readable by other users (0600, logs at most 0640); folders are at most traversable."""
    root = cluster.run_dir
    node = root / "nodes" / "n1"
    expected = [node / name for name in ("retained.sqlite", "sessions.sqlite", "state.json",
                                         "node.log", "mosquitto.log", "mosquitto.conf", "secret",
                                         "node.toml")]
    expected += [node / "spill" / "n2.sqlite", root / "cluster.json", root / "admin-token",
                 root / "peer-token"]
    assert all(p.exists() for p in expected), [str(p) for p in expected if not p.exists()]
    assert list(node.glob("*.sqlite-wal")), "SQLite's write-ahead logs are checked too"
    loose, checked = [], 0
    for path in root.rglob("*"):
        mode = path.lstat().st_mode
        if stat.S_ISREG(mode):
            checked += 1
            if stat.S_IMODE(mode) & 0o037:
                loose.append(f"{path.relative_to(root)} {stat.S_IMODE(mode):o}")
        elif stat.S_ISDIR(mode) and stat.S_IMODE(mode) & 0o066:
            loose.append(f"{path.relative_to(root)}/ {stat.S_IMODE(mode):o}")
    assert checked > 20 and not loose, loose
