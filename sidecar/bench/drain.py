"""`mqfed bench --drain`: how long draining a node takes (issue 20), on a real 3-node cluster.

1,000 MQTT 5 clients (by default) connect through the HAProxy front while only n1 is in it,
so n1 holds them all; 100 of them have persistent sessions (session expiry 1 h, one
subscription each), the others clean ones. Then n2 and n3 join the front again and n1 is
drained through its admin API (`mqfed ctl drain n1`). Reported: the time until no client is
connected to n1, until it owns no session, and until it is drained; how many clients
reconnected, and how many persistent sessions resumed with session present. Clients run in
worker processes (paho, a thread each), and reconnect through the front like devices do.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sidecar._proto import admin_pb2
from sidecar.admin.client import AdminClient
from sidecar.bench.cluster import BenchCluster
from sidecar.bench.scale_state import wait_until
from sidecar.devcluster import haproxy
from sidecar.devcluster.layout import Layout
from sidecar.tokens import read_token

EXPIRY = 3600
WORKERS = 4
POLL = 0.1


@dataclass(frozen=True)
class DrainOptions:
    run_dir: Path
    base_port: int
    clients: int = 1000
    persistent: int = 100
    timeout: float = 300.0


@dataclass
class _Client:
    client: mqtt.Client
    persistent: bool
    connects: int = 0
    present: int = 0  # reconnects with session present


def _worker(conn: Connection, port: int, ids: list[tuple[str, bool]]) -> None:
    """Child process: connect `ids` (client id, persistent) through the front, report."""
    clients: list[_Client] = []
    lock = threading.Lock()
    try:
        for client_id, persistent in ids:
            c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                            client_id=client_id, protocol=mqtt.MQTTv5)
            c.reconnect_delay_set(0.1, 1.0)
            entry = _Client(c, persistent)
            up = threading.Event()

            def on_connect(cl, u, flags, rc, props, entry=entry, up=up) -> None:
                if not rc.is_failure:
                    with lock:
                        entry.connects += 1
                        if entry.connects > 1 and flags.session_present:
                            entry.present += 1
                    up.set()
            c.on_connect = on_connect
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = EXPIRY if persistent else 0
            c.connect("127.0.0.1", port, 60, clean_start=mqtt.MQTT_CLEAN_START_FIRST_ONLY,
                      properties=props)
            c.loop_start()
            if not up.wait(30):
                raise RuntimeError(f"{client_id}: no CONNACK")
            if persistent:
                done = threading.Event()
                c.on_subscribe = lambda *a, done=done: done.set()
                c.subscribe(f"drain-bench/{client_id}", 1)
                if not done.wait(30):
                    raise RuntimeError(f"{client_id}: no SUBACK")
            clients.append(entry)
        conn.send(("ready", len(clients)))
        while True:
            cmd = conn.recv()
            if cmd == "report":
                with lock:
                    conn.send(("report", {
                        "reconnected": sum(1 for e in clients if e.connects > 1),
                        "persistent_reconnected": sum(1 for e in clients
                                                      if e.persistent and e.connects > 1),
                        "session_present": sum(e.present for e in clients)}))
            else:
                break
    except Exception as exc:  # reported to the parent
        conn.send(("error", str(exc)))
    finally:
        for e in clients:
            props = Properties(PacketTypes.DISCONNECT)
            props.SessionExpiryInterval = 0  # done: the sessions may go
            e.client.disconnect(properties=props)
            e.client.loop_stop()
        conn.close()


class _Workers:
    """Client processes, always stopped by PID."""

    def __init__(self, port: int, ids: list[tuple[str, bool]]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for k in range(WORKERS):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, port, ids[k::WORKERS]),
                               name=f"mqfed-bench-drain-{k}", daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def ask(self, message: str | None, timeout: float) -> list[Any]:
        out = []
        for conn in self.conns:
            if message is not None:
                conn.send(message)
            if not conn.poll(timeout):
                raise RuntimeError("a client process did not answer")
            kind, detail = conn.recv()
            if kind == "error":
                raise RuntimeError(f"client process: {detail}")
            out.append(detail)
        return out

    def stop(self) -> None:
        for conn in self.conns:
            try:
                conn.send("stop")
            except OSError:
                pass
        for proc in self.procs:
            proc.join(15)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def _front(cluster: BenchCluster, enable: bool, nodes: list[str]) -> None:
    layout = Layout(cluster.base_port, cluster.run_dir)
    for node in nodes:
        haproxy.command(layout, f"{'enable' if enable else 'disable'} server nodes/{node}")
    if enable:
        wait_until(lambda: all(haproxy.servers_state(layout).get(n, "").startswith("UP")
                               for n in nodes), 30,
                   "HAProxy to send clients to " + ", ".join(nodes))


async def _drain(admin: str, token: str, timeout: float) -> list[tuple[float, Any]]:
    """Drain n1; its progress every POLL seconds (monotonic time, progress) until drained,
    after the time the call was made (with no progress)."""
    client = AdminClient(admin, token)
    try:
        seen = [(time.monotonic(), None)]
        seen.append((time.monotonic(), (await client.call(
            "Drain", admin_pb2.DrainRequest(node_id="n1"), 10)).progress))
        deadline = time.monotonic() + timeout
        while seen[-1][1].state != "drained":
            if time.monotonic() > deadline:
                raise RuntimeError(f"n1 not drained after {timeout:.0f} s")
            await asyncio.sleep(POLL)
            reply = await client.call("Drain", admin_pb2.DrainRequest(
                node_id="n1", status_only=True), 10)
            seen.append((time.monotonic(), reply.progress))
        return seen
    finally:
        await client.close()


def _online(cluster: BenchCluster, node: str) -> int:
    return int((cluster.state(node).get("session_counts") or {}).get("online") or 0)


def run_drain(opts: DrainOptions, say: Callable[[str], None]) -> dict[str, Any]:
    """The drain benchmark on a fresh 3-node cluster in `opts.run_dir`; stops it at the end."""
    cluster = BenchCluster(opts.run_dir, opts.base_port, timeout=120, nodes=3)
    run = f"{int(time.time()) % 100000}"
    ids = [(f"db-{run}-{i}", i < opts.persistent) for i in range(opts.clients)]
    workers = None
    try:
        say(f"starting a 3-node cluster in {opts.run_dir} ...")
        cluster.up()
        _front(cluster, False, ["n2", "n3"])
        say(f"connecting {opts.clients:,} clients ({opts.persistent} persistent) to n1 "
            "through the front ...")
        workers = _Workers(cluster.base_port, ids)
        workers.ask(None, opts.timeout)
        wait_until(lambda: _online(cluster, "n1") >= opts.clients, 60, "n1 to hold every client")
        _front(cluster, True, ["n2", "n3"])
        token = read_token(opts.run_dir / "admin-token")
        say("draining n1 ...")
        seen = asyncio.run(_drain(cluster.node("n1")["admin"], token, opts.timeout))
        start = seen[0][0]

        def first(pred: Callable[[Any], bool]) -> float:
            return round(next(t for t, p in seen[1:] if pred(p)) - start, 2)

        # drained = no client on n1; a kicked client may still be between its reconnects
        # (paho backs off up to 1 s), so the count is taken once all are back or after 30 s
        deadline = time.monotonic() + 30
        while True:
            reports = workers.ask("report", 30)
            back = sum(r["reconnected"] for r in reports)
            if back >= opts.clients or time.monotonic() > deadline:
                break
            time.sleep(POLL)
        reconnected_after = round(time.monotonic() - start, 2)
        last = seen[-1][1]
        return {"kind": "drain", "clients": opts.clients, "persistent": opts.persistent,
                "no_client_after_s": first(lambda p: p.clients == 0),
                "no_session_after_s": first(lambda p: p.clients == 0
                                            and p.sessions_owned == 0),
                "drained_after_s": first(lambda p: p.state == "drained"),
                "all_reconnected_after_s": reconnected_after,
                "kicks": last.kicks, "hand_offs": last.hand_offs,
                "reconnected": sum(r["reconnected"] for r in reports),
                "persistent_reconnected": sum(r["persistent_reconnected"] for r in reports),
                "session_present": sum(r["session_present"] for r in reports),
                "elsewhere": {n: _online(cluster, n) for n in ("n2", "n3")}}
    finally:
        if workers is not None:
            workers.stop()
        complaint = cluster.down()
        if complaint:
            say(f"mqfed down: {complaint}")


def render_drain(r: dict[str, Any]) -> str:
    return "\n".join([
        f"drain of n1 holding {r['clients']:,} clients ({r['persistent']} with persistent "
        f"sessions): drained in {r['drained_after_s']} s",
        f"  no client left after {r['no_client_after_s']} s, no session owned after "
        f"{r['no_session_after_s']} s ({r['kicks']} kick rounds, {r['hand_offs']} hand-off "
        "rounds)",
        f"  {r['reconnected']:,} clients reconnected elsewhere (counted after "
        f"{r['all_reconnected_after_s']} s) "
        f"({', '.join(f'{n}: {c}' for n, c in r['elsewhere'].items())} online); "
        f"{r['session_present']} of {r['persistent_reconnected']} persistent sessions resumed "
        "with session present"])
