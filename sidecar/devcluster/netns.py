"""Network namespaces of a local cluster (`mqfed up --netns`; root only) (adapter).

Each node (its sidecar and the Mosquitto it starts) runs in its own namespace
`mqfed-<tag>-n<i>` with one interface, `eth0` at 10.213.<x>.<10+i>/24, the far end of a veth
pair whose near end `mqv<tag><i>` is enslaved to the bridge `mqb<tag>`. The bridge lives in a
hub namespace `mqfed-<tag>-hub` (so bridged packets meet the hub's empty packet filter, not
the host's: a host with Docker drops forwarded packets), joined to the launcher's namespace,
where etcd and the HAProxy front run, by one more veth pair: `mqr<tag>` at 10.213.<x>.1 on
the launcher's side. The tag (4 hex digits) and <x> come from the run dir, so two clusters
never share names; a subnet already in use moves on to the next <x>. Nothing else is touched:
no default route, no NAT, no rule in the host's packet filter.

Faults are packet-filter rules in the node namespaces (`iptables`, the nft backend; `tc netem`
is not in every kernel): a partition, one direction of one stream, random loss, etcd cut off.
`clear_rules` removes them all; `destroy` removes the namespaces, the veth pairs and the bridge
(their processes must be stopped first: a namespace lives while a process is in it).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.devcluster.errors import ClusterError

FIRST_X, LAST_X = 20, 249


@dataclass(frozen=True)
class Topology:
    """Names and addresses of one cluster's namespaces."""

    tag: str
    x: int  # the third octet of 10.213.x.0/24

    @classmethod
    def for_run_dir(cls, run_dir: Path) -> Topology:
        digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()
        return cls(digest[:4], FIRST_X + int(digest[4:8], 16) % (LAST_X - FIRST_X + 1))

    @property
    def bridge(self) -> str:
        return f"mqb{self.tag}"

    @property
    def hub(self) -> str:
        return f"mqfed-{self.tag}-hub"

    @property
    def uplink(self) -> str:
        """The launcher's end of the veth pair to the hub (it holds the gateway address)."""
        return f"mqr{self.tag}"

    @property
    def gateway(self) -> str:
        return f"10.213.{self.x}.1"

    @property
    def subnet(self) -> str:
        return f"10.213.{self.x}.0/24"

    def namespace(self, index: int) -> str:
        return f"mqfed-{self.tag}-n{index}"

    def veth(self, index: int) -> str:
        return f"mqv{self.tag}{index}"

    def ip(self, index: int) -> str:
        return f"10.213.{self.x}.{10 + index}"

    def exec_prefix(self, index: int) -> list[str]:
        """Run a command inside node `index`'s namespace."""
        return ["ip", "netns", "exec", self.namespace(index)]

    def to_json(self) -> dict[str, Any]:
        return {"tag": self.tag, "x": self.x}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Topology | None:
        return cls(str(data["tag"]), int(data["x"])) if data else None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def check_usable() -> None:
    """Refuse clearly where namespaces cannot be made."""
    if os.geteuid() != 0:
        raise ClusterError("--netns needs root (network namespaces, veth pairs, a bridge)")
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            raise ClusterError(f"--netns needs {tool} (Debian: apt-get install iproute2 "
                               "iptables)")


def _subnet_taken(subnet: str) -> bool:
    net = ipaddress.ip_network(subnet)
    out = _ip("-o", "-4", "addr", "show", check=False).stdout
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = ipaddress.ip_interface(parts[parts.index("inet") + 1])
            if addr.network.overlaps(net):
                return True
    return False


def choose(run_dir: Path) -> Topology:
    """The run dir's topology, on a subnet no interface uses yet."""
    topo = Topology.for_run_dir(run_dir)
    for step in range(LAST_X - FIRST_X + 1):
        x = FIRST_X + (topo.x - FIRST_X + step) % (LAST_X - FIRST_X + 1)
        candidate = Topology(topo.tag, x)
        if not _subnet_taken(candidate.subnet):
            return candidate
    raise ClusterError("no free 10.213.x.0/24 subnet for the cluster's namespaces")


def create(topo: Topology) -> None:
    """The hub namespace with the bridge, joined to this namespace at the gateway address."""
    destroy_bridge(topo)
    hub = topo.hub
    _ip("netns", "add", hub)
    _ip("-n", hub, "link", "set", "lo", "up")
    _ip("-n", hub, "link", "add", topo.bridge, "type", "bridge")
    _ip("-n", hub, "link", "set", topo.bridge, "up")
    _ip("link", "add", topo.uplink, "type", "veth", "peer", "name", f"{topo.uplink}p")
    _ip("link", "set", f"{topo.uplink}p", "netns", hub)
    _ip("-n", hub, "link", "set", f"{topo.uplink}p", "master", topo.bridge)
    _ip("-n", hub, "link", "set", f"{topo.uplink}p", "up")
    _ip("addr", "add", f"{topo.gateway}/24", "dev", topo.uplink)
    _ip("link", "set", topo.uplink, "up")


def add_node(topo: Topology, index: int) -> None:
    """Node `index`'s namespace, joined to the bridge."""
    remove_node(topo, index)
    ns, veth = topo.namespace(index), topo.veth(index)
    _ip("netns", "add", ns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
    _ip("link", "set", f"{veth}p", "netns", ns)
    _ip("link", "set", veth, "netns", topo.hub)
    _ip("-n", topo.hub, "link", "set", veth, "master", topo.bridge)
    _ip("-n", topo.hub, "link", "set", veth, "up")
    _ip("-n", ns, "link", "set", f"{veth}p", "name", "eth0")
    _ip("-n", ns, "addr", "add", f"{topo.ip(index)}/24", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "link", "set", "lo", "up")


def remove_node(topo: Topology, index: int) -> None:
    _ip("-n", topo.hub, "link", "del", topo.veth(index), check=False)  # its peer goes too
    _ip("link", "del", topo.veth(index), check=False)  # (if it never reached the hub)
    _ip("netns", "del", topo.namespace(index), check=False)


def destroy_bridge(topo: Topology) -> None:
    """The uplink pair, the hub namespace and its bridge."""
    _ip("link", "del", topo.uplink, check=False)  # its peer goes with it
    _ip("netns", "del", topo.hub, check=False)


def destroy(topo: Topology, indexes: Iterable[int]) -> None:
    """Remove every namespace, veth pair and the bridge of `topo` (also ones left by a crashed
    launcher: every namespace named after the tag)."""
    names = {topo.namespace(i) for i in indexes}
    listed = _ip("netns", "list", check=False).stdout.split()
    names |= {n for n in listed if n.startswith(f"mqfed-{topo.tag}-n")
              and n.rpartition("-n")[2].isdigit()}
    for name in names:
        index = name.rpartition("-n")[2]
        if index.isdigit():
            remove_node(topo, int(index))
    destroy_bridge(topo)


def leftovers(topo: Topology) -> list[str]:
    """What of `topo` still exists (for checks and tests)."""
    out = [n for n in _ip("netns", "list", check=False).stdout.split()
           if n.startswith(f"mqfed-{topo.tag}-")]
    links = _ip("-o", "link", "show", check=False).stdout
    out += [name for name in (topo.uplink, f"mqv{topo.tag}", topo.bridge)
            if f" {name}" in links]
    return out


class NetnsControl:
    """Packet-filter faults between the nodes of a namespaced cluster."""

    def __init__(self, topo: Topology, indexes: dict[str, int], etcd_port: int) -> None:
        self.topo = topo
        self.indexes = indexes  # node id -> index
        self.etcd_port = etcd_port

    @property
    def gateway(self) -> str:
        return self.topo.gateway

    def _ipt(self, node: str, *rule: str) -> None:
        argv = [*self.topo.exec_prefix(self.indexes[node]), "iptables", "-w", *rule]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise ClusterError(f"iptables in {node}'s namespace failed: {result.stderr.strip()}")

    def _ip_of(self, node: str) -> str:
        return self.topo.ip(self.indexes[node])

    def drop_between(self, a: str, b: str) -> None:
        """No packet between a and b (rules in a's namespace)."""
        self._ipt(a, "-A", "OUTPUT", "-d", self._ip_of(b), "-j", "DROP")
        self._ipt(a, "-A", "INPUT", "-s", self._ip_of(b), "-j", "DROP")

    def drop_stream(self, a: str, b: str, b_port: int) -> None:
        """No packet of the connections a opens to b's `b_port` (a's stream to b); b's
        connections to a pass."""
        self._ipt(a, "-A", "OUTPUT", "-d", self._ip_of(b), "-p", "tcp", "--dport", str(b_port),
                  "-j", "DROP")
        self._ipt(a, "-A", "INPUT", "-s", self._ip_of(b), "-p", "tcp", "--sport", str(b_port),
                  "-j", "DROP")

    def lose_between(self, a: str, b: str, probability: float) -> None:
        """Each packet between a and b dropped with `probability` (each direction)."""
        for chain, flag in (("OUTPUT", "-d"), ("INPUT", "-s")):
            self._ipt(a, "-A", chain, flag, self._ip_of(b), "-m", "statistic", "--mode",
                      "random", "--probability", f"{probability:.4f}", "-j", "DROP")

    def drop_to_host(self, node: str, host: str) -> None:
        """`node` cannot reach etcd (on `host`)."""
        self._ipt(node, "-A", "OUTPUT", "-d", host, "-p", "tcp", "--dport",
                  str(self.etcd_port), "-j", "DROP")
        self._ipt(node, "-A", "INPUT", "-s", host, "-p", "tcp", "--sport",
                  str(self.etcd_port), "-j", "DROP")

    def clear_rules(self) -> None:
        for node in self.indexes:
            for chain in ("INPUT", "OUTPUT"):
                self._ipt(node, "-F", chain)
