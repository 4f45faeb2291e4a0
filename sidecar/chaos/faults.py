"""How each scenario's fault is done to a running cluster (adapter).

A fault is `prepare()` (before the load), `inject()`, `heal()` and `cleanup()` (always, also
after a failure: the cluster is left as it was found, processes running, files and rules
removed). On a loopback cluster partitions use the sidecars' `blocked-peers` files and a slow
link a delaying proxy the node advertises; on a `mqfed up --netns` cluster partitions, one-way
cuts, packet loss and an isolated etcd are real packet-filter rules in the nodes' namespaces
(`sidecar.devcluster.netns`).
"""

from __future__ import annotations

import contextlib
import os
import signal

from sidecar.chaos.cluster import ChaosCluster
from sidecar.chaos.proxy import DelayProxy
from sidecar.chaos.scenarios import Layout, Scenario

SKEW_MS = 2500
"""The clock-skew scenario's offset: half the HLC's tolerated drift (sidecar.hlc, 5 s)."""


class NeedsNetns(RuntimeError):
    """The scenario needs real network rules: a cluster started with `mqfed up --netns`."""


class Fault:
    """Nothing: the base of every fault."""

    def __init__(self, cluster: ChaosCluster, lay: Layout) -> None:
        self.cluster, self.lay = cluster, lay

    def prepare(self) -> None:
        """Before the load starts."""

    def inject(self) -> None:
        """The fault begins."""

    def heal(self) -> None:
        """The fault ends."""

    def cleanup(self) -> None:
        """Leave the cluster as found (always called)."""


class KillNode(Fault):
    def inject(self) -> None:
        self.cluster.mqfed("stop-node", self.lay.target, "--kill")

    def heal(self) -> None:
        self.cluster.mqfed("start-node", self.lay.target)

    def cleanup(self) -> None:
        _ensure_running(self.cluster, self.lay.target)


class KillSidecar(KillNode):
    def inject(self) -> None:
        self.cluster.mqfed("stop-node", self.lay.target, "--sidecar-only")


class StopNode(Fault):
    def __init__(self, cluster: ChaosCluster, lay: Layout) -> None:
        super().__init__(cluster, lay)
        self.stopped: list[int] = []

    def inject(self) -> None:
        self.stopped = self.cluster.pids(self.lay.target)
        for pid in self.stopped:
            os.kill(pid, signal.SIGSTOP)

    def heal(self) -> None:
        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.stopped = []

    def cleanup(self) -> None:
        self.heal()


class Partition(Fault):
    """The first k nodes | the others, both directions."""

    def _sides(self) -> tuple[list[str], list[str]]:
        a = list(self.lay.group)
        return a, [n for n in self.cluster.nodes if n not in a]

    def inject(self) -> None:
        a, b = self._sides()
        net = self.cluster.netns
        if net is not None:
            for x in a:
                for y in b:
                    net.drop_between(x, y)
            return
        for node in a:
            self.cluster.block(node, b)
        for node in b:
            self.cluster.block(node, a)

    def heal(self) -> None:
        net = self.cluster.netns
        if net is not None:
            net.clear_rules()
            return
        for node in self.cluster.nodes:
            self.cluster.block(node, [])

    def cleanup(self) -> None:
        self.heal()


class OneWay(Fault):
    """The target's stream to the other node cut; the other node's stream to it works."""

    def prepare(self) -> None:
        if self.cluster.netns is None:
            raise NeedsNetns("one-way needs real packet rules: run it on a cluster started "
                             "with `mqfed up --netns` (a loopback cluster cannot tell one "
                             "direction of a stream from the other)")

    def inject(self) -> None:
        self.cluster.netns.drop_stream(self.lay.target, self.lay.other,
                                       self.cluster.grpc(self.lay.other)[1])

    def heal(self) -> None:
        self.cluster.netns.clear_rules()

    def cleanup(self) -> None:
        if self.cluster.netns is not None:
            self.cluster.netns.clear_rules()


class IsolateEtcd(Fault):
    def __init__(self, cluster: ChaosCluster, lay: Layout) -> None:
        super().__init__(cluster, lay)
        self.frozen: int | None = None

    def inject(self) -> None:
        net = self.cluster.netns
        if net is not None:
            for node in self.cluster.nodes:
                net.drop_to_host(node, net.gateway)
            return
        self.frozen = self.cluster.etcd_pid()  # every node loses etcd: freeze it
        if self.frozen is not None:
            os.kill(self.frozen, signal.SIGSTOP)

    def heal(self) -> None:
        if self.cluster.netns is not None:
            self.cluster.netns.clear_rules()
        if self.frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.frozen, signal.SIGCONT)
            self.frozen = None

    def cleanup(self) -> None:
        self.heal()


class SlowLink(Fault):
    """Every stream into the other node passes a proxy that delays 100 ms +- 20 ms while the
    fault lasts (the node advertises the proxy: its sidecar restarts once before and once
    after the load)."""

    DELAY_MS, JITTER_MS = 100.0, 20.0

    def __init__(self, cluster: ChaosCluster, lay: Layout) -> None:
        super().__init__(cluster, lay)
        self.proxy: DelayProxy | None = None

    def prepare(self) -> None:
        host, port = self.cluster.grpc(self.lay.other)
        listen = self.cluster.netns.gateway if self.cluster.netns is not None else "127.0.0.1"
        self.proxy = DelayProxy(listen, host, port)
        self.cluster.restart_sidecar(self.lay.other, {"MQFED_GRPC_ADVERTISE": self.proxy.address})
        self.cluster.wait_meshed()

    def inject(self) -> None:
        assert self.proxy is not None
        self.proxy.set_delay(self.DELAY_MS, self.JITTER_MS)

    def heal(self) -> None:
        if self.proxy is not None:
            self.proxy.set_delay(0)

    def cleanup(self) -> None:
        if self.proxy is None:
            return
        try:
            self.cluster.restart_sidecar(self.lay.other)
            self.cluster.wait_meshed()
        finally:
            self.proxy.close()
            self.proxy = None


class LossyLink(Fault):
    LOSS = 0.05

    def prepare(self) -> None:
        if self.cluster.netns is None:
            raise NeedsNetns("lossy-link needs real packet rules: run it on a cluster started "
                             "with `mqfed up --netns` (tc netem is not available here; the "
                             "loss is an iptables statistic rule)")

    def inject(self) -> None:
        self.cluster.netns.lose_between(self.lay.target, self.lay.other, self.LOSS)

    def heal(self) -> None:
        self.cluster.netns.clear_rules()

    def cleanup(self) -> None:
        if self.cluster.netns is not None:
            self.cluster.netns.clear_rules()


class RollingRestart(Fault):
    """Each node in turn: a graceful stop, then a start (the `mqfed stop-node` / `start-node`
    loop; `mqfed rolling-restart`, issue 20, is not used yet)."""

    def inject(self) -> None:
        for node in self.cluster.nodes:
            self.cluster.mqfed("stop-node", node)
            self.cluster.mqfed("start-node", node)
            self.cluster.wait_meshed()

    def cleanup(self) -> None:
        for node in self.cluster.nodes:
            _ensure_running(self.cluster, node)


class ClockSkew(Fault):
    """The other node's sidecar runs its wall clock SKEW_MS ahead for the whole load."""

    def __init__(self, cluster: ChaosCluster, lay: Layout) -> None:
        super().__init__(cluster, lay)
        self.skewed = False

    def prepare(self) -> None:
        self.cluster.restart_sidecar(self.lay.other, {"MQFED_DRILL_CLOCK_SKEW_MS": str(SKEW_MS)})
        self.skewed = True
        self.cluster.wait_meshed()

    def cleanup(self) -> None:
        if self.skewed:
            self.skewed = False
            self.cluster.restart_sidecar(self.lay.other)
            self.cluster.wait_meshed()


def _ensure_running(cluster: ChaosCluster, node: str) -> None:
    cluster.refresh()
    rec = cluster.state.nodes[node]
    if rec.sidecar is None:
        cluster.mqfed("start-node", node)


FAULTS: dict[str, type[Fault]] = {
    "kill-node": KillNode, "kill-sidecar": KillSidecar, "stop-node": StopNode,
    "partition": Partition, "one-way": OneWay, "isolate-etcd": IsolateEtcd,
    "slow-link": SlowLink, "lossy-link": LossyLink, "rolling-restart": RollingRestart,
    "clock-skew": ClockSkew,
}
INSTANT = {"kill-node", "kill-sidecar", "rolling-restart"}
"""Faults healed right after they are injected (a restart is the healing)."""
WHOLE_LOAD = {"clock-skew"}
"""Faults that last the whole load (set up in `prepare`)."""


def make(scenario: Scenario, cluster: ChaosCluster, lay: Layout) -> Fault:
    return FAULTS[scenario.name](cluster, lay)
