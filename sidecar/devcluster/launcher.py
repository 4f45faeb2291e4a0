"""Cluster operations: up, down, add/stop/start a node (orchestration of the adapters).

Every process started is recorded in `<run dir>/cluster.json` right after it starts, so
whatever happens (failure, Ctrl-C, a crashed launcher) `down` can stop it by PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sidecar.devcluster import etcd, haproxy, netns, nodes
from sidecar.devcluster.layout import MAX_NODES, PORT_SPAN, Layout, node_id, node_index
from sidecar.devcluster.net import port_open, taken
from sidecar.devcluster.procs import ProcRef, identify, reap, stop, tail, wait_gone
from sidecar.devcluster.state import (
    ClusterError,
    ClusterState,
    NodeRecord,
    load,
    locked,
    remove,
    save,
)


@dataclass(frozen=True)
class UpOptions:
    nodes: int
    base_port: int
    run_dir: Path
    cluster: str = "mqfed"
    log_level: str | None = None
    timeout: float = 30.0
    foreground: bool = False
    netns: bool = False  # each node in its own network namespace (root)


# ---- signals: act on them only where no started process can go unrecorded ----------------------
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_stop_requested: list[int] = []


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into KeyboardInterrupt raised at the next checkpoint."""
    old = {sig: signal.signal(sig, lambda signum, _f: _stop_requested.append(signum))
           for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _checkpoint() -> None:
    if _stop_requested:
        raise KeyboardInterrupt(f"signal {_stop_requested[0]}")


# ---- helpers ---------------------------------------------------------------------------------
def _refuse_taken(ports: list[tuple[int, str]], layout: Layout) -> None:
    busy = taken(ports)
    if busy:
        names = ", ".join(f"{port} ({what}): {problem}" for port, what, problem in busy)
        raise ClusterError(
            f"cannot listen on 127.0.0.1 port(s) {names}. Stop what uses them, or choose "
            f"another --base-port (a cluster with base port P uses P..P+{PORT_SPAN - 1}: front P, "
            "node i MQTT P+i, gRPC P+100+i, admin P+200+i, metrics P+300+i, etcd P+400 and "
            f"P+401; this one has P={layout.base_port}).")


def _wait(ready: Callable[[], bool], ref: ProcRef, what: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        _checkpoint()
        if ref.exited():
            raise ClusterError(f"{what} exited during start-up; its log {log} ends with:\n"
                               + tail(log))
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} was not ready after {timeout:.0f}s; its log {log} "
                               "ends with:\n" + tail(log))
        time.sleep(0.1)


def _node_failure(layout: Layout, node: NodeRecord, why: str) -> str:
    node_dir = layout.node_dir(node.id)
    text = (f"node {node.id} {why}; its log {nodes.log_path(layout, node.id)} ends with:\n"
            + tail(nodes.log_path(layout, node.id)))
    mosq_log = node_dir / "mosquitto.log"
    if mosq_log.exists():
        text += f"\nand its Mosquitto log {mosq_log} ends with:\n" + tail(mosq_log, 10)
    return text


def _wait_nodes(layout: Layout, group: list[NodeRecord], timeout: float,
                on_ready: Callable[[NodeRecord], None] | None = None) -> None:
    """Wait until every node of `group` reports ready; record each one's Mosquitto (and
    tell `on_ready`)."""
    pending = list(group)
    deadline = time.monotonic() + timeout
    while pending:
        _checkpoint()
        for node in list(pending):
            if nodes.ready(layout, node):
                node.mosquitto = nodes.find_mosquitto(layout, node)
                pending.remove(node)
                if on_ready is not None:
                    on_ready(node)
            elif not node.sidecar or node.sidecar.exited():
                raise ClusterError(_node_failure(layout, node, "exited during start-up"))
        if pending and time.monotonic() > deadline:
            raise ClusterError(_node_failure(layout, pending[0],
                                             f"was not ready after {timeout:.0f}s"))
        if pending:
            time.sleep(0.1)


def _stop_all(state: ClusterState) -> None:
    """Stop every recorded process except this one: front, nodes, leftover Mosquittos, etcd."""
    lay = state.layout
    if state.haproxy:
        stop([state.haproxy])
    brokers = [b for n in state.nodes.values() for b in nodes.mosquittos(lay, n)]
    stop([n.sidecar for n in state.nodes.values() if n.sidecar],
         timeout=nodes.SIDECAR_STOP_TIMEOUT)
    brokers += [b for n in state.nodes.values() for b in nodes.mosquittos(lay, n)]
    stop([b for b in brokers if b.running()])
    if state.etcd:
        stop([state.etcd])
    left = [r for r in state.refs() if r.pid != os.getpid() and r.running()]
    if left:
        raise ClusterError("could not stop PIDs " + ", ".join(str(r.pid) for r in left)
                           + f" of {lay.run_dir}; check them with ps")
    if state.netns is not None:  # after every process in them stopped
        netns.destroy(state.netns, [n.index for n in state.nodes.values()])


def _clean_previous(layout: Layout) -> None:
    for path in (layout.etcd_dir, layout.haproxy_dir, layout.nodes_dir):
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ClusterError(f"cannot remove the previous cluster's {path}: {exc}; remove it "
                               "yourself or use another --run-dir") from None


def _load(run_dir: Path) -> ClusterState:
    state = load(run_dir)
    if state is None:
        raise ClusterError(f"no cluster in {run_dir} ({run_dir / 'cluster.json'} does not "
                           "exist); start one with `mqfed up --run-dir "
                           f"{run_dir}` or pass the --run-dir it was started with")
    return state


def _node(state: ClusterState, ident: str) -> NodeRecord:
    node = state.nodes.get(ident)
    if node is None:
        known = ", ".join(state.nodes) or "none"
        raise ClusterError(f"no node {ident!r} in {state.layout.run_dir} (nodes: {known})")
    return node


def _new_node(state: ClusterState, index: int) -> NodeRecord:
    """Node number `index` (with --netns: in its new namespace)."""
    node = NodeRecord(node_id(index), index, state.layout.node_ports(index))
    if state.netns is not None:
        netns.add_node(state.netns, index)
        node.host = state.netns.ip(index)
    return node


# ---- commands --------------------------------------------------------------------------------
def check(opts: UpOptions) -> tuple[str, str]:
    """Refuse bad options; return the etcd and haproxy binaries."""
    if not 1 <= opts.nodes <= MAX_NODES:
        raise ClusterError(f"--nodes must be between 1 and {MAX_NODES}, got {opts.nodes}")
    try:
        Layout.check_base_port(opts.base_port)
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
    etcd_bin, haproxy_bin = etcd.find_etcd(), haproxy.find_haproxy()
    if not etcd_bin:
        raise ClusterError("etcd not found: install it (Debian: apt-get install etcd-server)")
    if not haproxy_bin:
        raise ClusterError("haproxy not found: install it (Debian: apt-get install haproxy)")
    if opts.netns:
        netns.check_usable()
    return etcd_bin, haproxy_bin


Step = Callable[[int, int, str], None]  # (steps done, steps in all, what was just done)


def up(opts: UpOptions, step: Step | None = None) -> ClusterState:
    """Start etcd, the nodes and the front; on any failure stop what was started. `step`
    hears of each part ready: etcd, each node, the front (nodes + 2 steps)."""
    etcd_bin, haproxy_bin = check(opts)
    layout = Layout(opts.base_port, opts.run_dir)
    with locked(opts.run_dir):
        old = load(opts.run_dir)
        if old is not None:
            alive = [r for r in old.refs() if r.running()]
            if alive:
                raise ClusterError(f"a cluster already runs in {opts.run_dir} (PIDs "
                                   + ", ".join(str(r.pid) for r in alive)
                                   + f"); stop it with `mqfed down --run-dir {opts.run_dir}`")
        ports = layout.shared_ports()
        for i in range(1, opts.nodes + 1):  # (in their own namespaces with --netns)
            ports += [] if opts.netns else layout.node_ports(i).named(node_id(i))
        _refuse_taken(ports, layout)
        _clean_previous(layout)
        state = ClusterState(opts.cluster, layout, opts.log_level)
        if opts.foreground:
            state.launcher = identify(os.getpid(), "up")
        try:
            _start(state, etcd_bin, haproxy_bin, opts, step or (lambda *_: None))
        except BaseException:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
            _stop_all(state)
            remove(state)
            raise
    return state


def _start(state: ClusterState, etcd_bin: str, haproxy_bin: str, opts: UpOptions,
           step: Step) -> None:
    lay = state.layout
    steps = opts.nodes + 2
    ready: list[str] = []
    if opts.netns:
        state.netns = netns.choose(lay.run_dir)
        save(state)  # recorded before it exists: a failure below removes it
        netns.create(state.netns)
    save(state)
    state.etcd = etcd.start(etcd_bin, lay, state.cluster,
                            state.netns.gateway if state.netns else None)
    save(state)
    _wait(lambda: etcd.healthy(lay), state.etcd, "etcd", etcd.log_path(lay), opts.timeout)
    if state.netns is None:  # namespaced nodes reach etcd off loopback: a password needs TLS
        etcd.enable_auth(lay, state.cluster, opts.timeout)
    step(1, steps, "etcd ready")
    for i in range(1, opts.nodes + 1):  # all known first: each node's peer list names them
        node = _new_node(state, i)
        state.nodes[node.id] = node
    for node in list(state.nodes.values()):
        node.sidecar = nodes.start(state, node)
        save(state)
        _checkpoint()

    def node_ready(node: NodeRecord) -> None:
        ready.append(node.id)
        step(1 + len(ready), steps, f"{node.id} ready")

    _wait_nodes(lay, list(state.nodes.values()), opts.timeout, node_ready)
    save(state)
    servers = [(n.id, n.ports.mqtt, n.ports.metrics, n.host) for n in state.nodes.values()]
    state.haproxy = haproxy.start(haproxy_bin, lay, servers)
    save(state)
    _checkpoint()
    _wait(lambda: haproxy.socket_path(lay).exists() and port_open(lay.front_port),
          state.haproxy, "HAProxy", haproxy.log_path(lay), opts.timeout)
    step(steps, steps, "front ready")


def serve(run_dir: Path) -> None:
    """Foreground `up`: wait for SIGINT, SIGTERM or SIGHUP, then stop the cluster."""
    with deferred_signals():
        while not _stop_requested:
            time.sleep(0.2)
            reap()
    shutdown(run_dir)


def shutdown(run_dir: Path) -> None:
    """Stop the cluster from its foreground launcher, ignoring further signals."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # stopping is bounded by SIGKILL timeouts
    with locked(run_dir):
        state = load(run_dir)
        if state is not None:
            _stop_all(state)
            remove(state)


def down(run_dir: Path) -> ClusterState:
    """Stop everything recorded in `run_dir` and forget the cluster."""
    state = _load(run_dir)
    launcher = state.launcher
    if launcher and launcher.pid != os.getpid() and launcher.signal(signal.SIGTERM):
        wait_gone([launcher], 90.0)  # a foreground `mqfed up` stops its own cluster
    with locked(run_dir):
        current = load(run_dir)
        if current is not None:
            _stop_all(current)
            remove(current)
            state = current
    return state


def add_node(run_dir: Path, timeout: float = 30.0) -> tuple[ClusterState, NodeRecord]:
    """Start node n<max+1> with its ports, join it to etcd and to the front."""
    with locked(run_dir):
        state = _load(run_dir)
        lay = state.layout
        if not (state.etcd and state.etcd.running() and state.haproxy
                and state.haproxy.running()):
            raise ClusterError(f"etcd or HAProxy of {run_dir} is not running; restart the "
                               f"cluster with `mqfed down --run-dir {run_dir}` and `mqfed up`")
        index = max((n.index for n in state.nodes.values()), default=0) + 1
        if index > MAX_NODES:
            raise ClusterError(f"a local cluster has at most {MAX_NODES} nodes")
        node = _new_node(state, index)
        if state.netns is None:
            _refuse_taken(node.ports.named(node.id), lay)
        state.nodes[node.id] = node
        try:
            node.sidecar = nodes.start(state, node)
            save(state)
            _wait_nodes(lay, [node], timeout)
            try:
                haproxy.add_server(lay, node.id, node.ports.mqtt, node.ports.metrics, node.host)
            except (OSError, RuntimeError) as exc:
                raise ClusterError(f"adding {node.id} to HAProxy failed: {exc}; see "
                                   f"{haproxy.log_path(lay)}") from None
            haproxy.write_config(lay, [(n.id, n.ports.mqtt, n.ports.metrics, n.host)
                                       for n in state.nodes.values()])
        except BaseException:
            nodes.stop_node(lay, node, "term")
            del state.nodes[node.id]
            if state.netns is not None:
                netns.remove_node(state.netns, node.index)
            save(state)
            raise
        save(state)
        return state, node


def stop_node(run_dir: Path, ident: str, how: str = "term") -> NodeRecord:
    """Stop one node; `how` is term, kill or sidecar (see nodes.stop_node)."""
    with locked(run_dir):
        state = _load(run_dir)
        node = _node(state, ident)
        sidecar_up = bool(node.sidecar and node.sidecar.running())
        if how == "sidecar" and not sidecar_up:
            raise ClusterError(f"the sidecar of {ident} is not running")
        if not sidecar_up and not nodes.mosquittos(state.layout, node):
            raise ClusterError(f"node {ident} is not running; start it with `mqfed start-node "
                               f"--run-dir {run_dir} {ident}`")
        nodes.stop_node(state.layout, node, how)
        save(state)
        return node


def start_node(run_dir: Path, ident: str, timeout: float = 30.0) -> tuple[ClusterState, NodeRecord]:
    """Start a stopped node again with its old ports (it adopts a Mosquitto still running)."""
    with locked(run_dir):
        state = _load(run_dir)
        lay = state.layout
        node = _node(state, ident)
        if node.sidecar and node.sidecar.running():
            raise ClusterError(f"node {ident} is already running (sidecar PID {node.sidecar.pid})")
        ports = [] if state.netns is not None else node.ports.named(node.id)
        if nodes.mosquittos(lay, node):  # its own Mosquitto still holds the MQTT port
            ports = [p for p in ports if p[0] != node.ports.mqtt]
        _refuse_taken(ports, lay)
        try:
            node.sidecar = nodes.start(state, node)
            save(state)
            _wait_nodes(lay, [node], timeout)
        except BaseException:
            nodes.stop_node(lay, node, "term")
            save(state)
            raise
        save(state)
        return state, node


def status(run_dir: Path) -> ClusterState:
    """The recorded cluster, with the refs of processes that no longer run cleared."""
    state = _load(run_dir)
    for name in ("launcher", "etcd", "haproxy"):
        ref = getattr(state, name)
        if ref and not ref.running():
            setattr(state, name, None)
    for node in state.nodes.values():
        if node.sidecar and not node.sidecar.running():
            node.sidecar = None
        running = nodes.mosquittos(state.layout, node)
        node.mosquitto = running[0] if running else None
    return state


def node_ident(text: str) -> str:
    """Accept `n3` or `3` for a node."""
    if text.isdigit():
        return node_id(int(text))
    if node_index(text) is None:
        raise ClusterError(f"node ids look like n1, n2, ...; got {text!r}")
    return text
