"""Sessions when nodes come and go (issue 17): a node whose Mosquitto restarted rebuilds the
sessions it owns, and a node that joins later serves existing sessions."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.sessions.clients import publish
from tests.system.sessions.test_sessions import _session


def test_a_restarted_mosquitto_gets_the_sessions_its_node_owns_back(own_cluster):
    cluster = own_cluster
    topic = "rebuilt/x"
    dev = _session(cluster, "n1", topic)
    wait_for(lambda: sum((cluster.state(n).get("cluster_sessions") or {})
                         .get("replicas_queueing", 0) for n in ("n2", "n3")) == 1,
             15, "a replica queueing")
    publish(cluster.ports["n2"], topic, 20)  # queued on n1 and on the replica
    old_pid = cluster.state("n1")["mosquitto_pid"]
    os.kill(old_pid, signal.SIGKILL)
    wait_for(lambda: cluster.state("n1").get("mosquitto_pid") not in (None, old_pid)
             and cluster.state("n1").get("ready"), 20, "n1's Mosquitto restarted")
    # n1 handed the session to its replica, which kept what was queued; resumed on n1
    assert dev.connect(cluster.ports["n1"]) is True, "session present after the restart"
    assert dev.wait_count(20) == list(range(20))
    cluster.wait_interest("n1", topic)
    publish(cluster.ports["n2"], topic, 20, start=20)
    assert dev.wait_count(40)[20:] == list(range(20, 40))
    dev.leave()


def test_a_node_that_joins_later_serves_existing_sessions(own_cluster):
    cluster = own_cluster
    topic = "joined/x"
    dev = _session(cluster, "n1", topic)
    publish(cluster.ports["n2"], topic, 50)
    added = mqfed("add-node", "--json", "--run-dir", str(cluster.run_dir))
    assert added.returncode == 0, added.stderr
    port = int(json.loads(added.stdout)["mqtt"].rpartition(":")[2])
    wait_for(lambda: cluster.state("n4").get("ready"), 20, "n4 ready")
    deadline = time.monotonic() + 10
    while dev.client_id not in {s for s in _sessions_known(cluster, "n4")}:
        assert time.monotonic() < deadline, "n4 never learned the session"
        time.sleep(0.1)
    assert dev.connect(port) is True, "session present on the new node"
    assert dev.wait_count(50) == list(range(50))
    dev.leave()


def _sessions_known(cluster, node: str) -> set[str]:
    out = cluster.state(node).get("cluster_sessions") or {}
    return set(out.get("clients", []))
