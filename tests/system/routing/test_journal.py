"""Issue 21: a node killed (kill -9 of Mosquitto and its sidecar, or of Mosquitto alone) under
QoS 1 load loses no acknowledged message. Mosquitto acknowledges a publish on receipt; what it
had not yet handed to peers is replayed from the plugin's journal when it starts again."""

from __future__ import annotations

import os
import signal
import threading
import time

import paho.mqtt.client as mqtt

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.node.mqtt import Client


class AckedPublisher:
    """QoS 1 payloads 0, 1, 2, ... at `rate` per second from a thread; `acked()` is the set
    the broker acknowledged (a PUBACK arrived)."""

    def __init__(self, port: int, topic: str, rate: float) -> None:
        self.topic, self.rate = topic, rate
        self.client = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                                  client_id=f"acked-{topic.replace('/', '-')}",
                                  protocol=mqtt.MQTTv5, reconnect_on_failure=False)
        self.connected = threading.Event()
        self.client.on_connect = lambda *a: self.connected.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.connected.wait(5), "publisher could not connect"
        self.infos: list[tuple[int, mqtt.MQTTMessageInfo]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        start = time.monotonic()
        i = 0
        while not self._stop.is_set():
            self.infos.append((i, self.client.publish(self.topic, str(i).encode(), qos=1)))
            i += 1
            time.sleep(max(0.0, start + i / self.rate - time.monotonic()))

    def stop(self) -> set[int]:
        self._stop.set()
        self._thread.join(5)
        self.client.loop_stop()
        return self.acked()

    def acked(self) -> set[int]:
        return {i for i, info in self.infos if info._published}  # no raise when disconnected


def _kill_under_load(cluster, kill) -> tuple[set[int], list[int]]:
    """Subscriber on n2, publisher on n1 at 500 msgs/s; `kill()` n1 after 3 s; returns what
    was acknowledged and what the subscriber got (once every acknowledged one arrived, or
    after 30 s)."""
    topic = f"kill/{kill.__name__}"
    sub = Client(cluster.ports["n2"], f"kill-sub-{kill.__name__}", clean=False,
                 session_expiry=600)
    pub = None
    try:
        assert sub.wait_connected()
        sub.subscribe(topic, qos=1)
        cluster.wait_interest("n2", topic)
        pub = AckedPublisher(cluster.ports["n1"], topic, rate=500)
        wait_for(lambda: len(sub.messages) > 1000, 15, "traffic flowing")
        kill()
        acked = pub.stop()
        pub = None
        assert len(acked) > 1000

        def arrived() -> bool:
            return acked <= {int(m.payload) for m in list(sub.messages)}
        try:
            wait_for(arrived, 30, "every acknowledged message")
        except TimeoutError:
            pass  # the assertion names what is missing
        return acked, [int(m.payload) for m in list(sub.messages)]
    finally:
        if pub is not None:
            pub.stop()
        sub.close()


def test_node_killed_under_qos1_load_loses_no_acknowledged_message(cluster_factory):
    cluster = cluster_factory(2)

    def node_kill() -> None:
        result = mqfed("stop-node", "--run-dir", str(cluster.run_dir), "n1", "--kill")
        assert result.returncode == 0, result.stderr
        result = mqfed("start-node", "--run-dir", str(cluster.run_dir), "n1")
        assert result.returncode == 0, result.stderr

    acked, got = _kill_under_load(cluster, node_kill)
    missing = sorted(acked - set(got))
    assert not missing, f"lost {len(missing)} of {len(acked)} acknowledged: {missing[:20]}"
    wait_for(lambda: (cluster.state("n1").get("journal") or {}).get("replayed_files"), 10,
             "the replay reported")
    journal = cluster.state("n1")["journal"]
    assert journal["replayed_files"] == 1 and journal["replay_failures"] == 0, journal
    assert journal["last_replay"]["problem"] is None
    # what is replayed was unconfirmed at the kill: a few ticks' worth, not the whole run
    assert journal["replayed"] < 0.2 * len(acked), journal


def test_mosquitto_killed_alone_is_restarted_and_replays(cluster_factory):
    cluster = cluster_factory(2)

    def mosquitto_kill() -> None:
        pid = cluster.state("n1")["mosquitto_pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: cluster.state("n1").get("mosquitto_pid") not in (None, pid)
                 and (cluster.state("n1").get("journal") or {}).get("replayed_files"),
                 20, "Mosquitto restarted by its sidecar and the journal replayed")

    acked, got = _kill_under_load(cluster, mosquitto_kill)
    missing = sorted(acked - set(got))
    assert not missing, f"lost {len(missing)} of {len(acked)} acknowledged: {missing[:20]}"
    assert cluster.state("n1")["broker_restarts"] == 1
