"""Overload: a cluster that cannot keep up pushes back on publishers (disconnects them before
acknowledging) instead of letting Mosquitto discard messages it has already acknowledged."""

from __future__ import annotations

import os
import signal
import threading
import time

import paho.mqtt.client as mqtt

from tests.harness.procs import wait_for
from tests.system.node.mqtt import Client
from tests.system.routing.traffic import check_sequence, values

SHED_TOTAL = ("mqfed_publishers_shed_total", ())
OVERFLOW = ("mqfed_dropped_total", (("reason", "mosquitto_overflow"),))


class RetryingPublisher(threading.Thread):
    """Publishes 0, 1, 2, ... at QoS 1, each after the PUBACK of the one before. When the
    broker closes the connection (paho reconnects and resends by itself), or no PUBACK comes,
    it connects again (clean start) and sends the same number again, as a well-behaved MQTT
    client does. `refused` counts the connections the broker closed."""

    def __init__(self, port: int, topic: str, count: int, pause: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.port, self.topic, self.count, self.pause = port, topic, count, pause
        self.acked = 0           # 0 .. acked-1 were acknowledged
        self.refused = 0         # connections the broker closed
        self.acked_at_refusal: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while self.acked < self.count and not self.halt.is_set():
            client = Client(self.port, f"overload-pub-{self.topic.replace('/', '-')}")
            client.client.on_disconnect = self._on_disconnect
            try:
                if client.wait_connected(5):
                    self._publish_until_refused(client.client)
            finally:
                client.close()
            time.sleep(0.2)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        if getattr(reason_code, "value", reason_code) != 0:  # not our own DISCONNECT
            self.refused += 1
            self.acked_at_refusal.append(self.acked)

    def _publish_until_refused(self, client: mqtt.Client) -> None:
        while self.acked < self.count and not self.halt.is_set():
            info = client.publish(self.topic, str(self.acked).encode(), qos=1)
            try:
                info.wait_for_publish(2.0)
            except (RuntimeError, ValueError):
                pass
            if not info.is_published():
                return
            self.acked += 1
            if self.pause:
                time.sleep(self.pause)


def _subscriber(cluster, topic: str) -> Client:
    sub = Client(cluster.ports["n2"], f"overload-sub-{topic.replace('/', '-')}")
    assert sub.wait_connected()
    sub.subscribe(topic, qos=1)
    cluster.wait_interest("n2", topic)
    return sub


def test_frozen_origin_sidecar_sheds_publishers_instead_of_losing_acked_messages(
        cluster_factory):
    """The origin sidecar frozen (SIGSTOP) under QoS 1 load: once `overload.backlog_max`
    (default 5,000) copies wait for it in Mosquitto, the plugin disconnects the publisher
    before acknowledging, far below what Mosquitto would keep (26,384); every acknowledged
    message arrives once the sidecar resumes, in order, and the publisher then finishes."""
    cluster = cluster_factory(2)
    count = 9000
    sub = _subscriber(cluster, "frozen/x")
    sidecar = cluster.state("n1")["pid"]
    pub = RetryingPublisher(cluster.ports["n1"], "frozen/x", count)
    os.kill(sidecar, signal.SIGSTOP)
    try:
        pub.start()
        wait_for(lambda: pub.refused >= 2, 60, "the publisher shed (twice: it came back)")
        first = pub.acked_at_refusal[0]
        assert 4000 <= first <= 5000, pub.acked_at_refusal
        assert pub.acked == first, "nothing is accepted while the sidecar stays silent"
    finally:
        os.kill(sidecar, signal.SIGCONT)
    pub.join(120)
    assert pub.acked == count, f"publisher stuck at {pub.acked} ({pub.refused} refusals)"
    wait_for(lambda: len(set(values(sub))) >= count, 60, "every acknowledged message")
    check_sequence(values(sub), count)
    metrics = cluster.metrics("n1")
    assert metrics[SHED_TOTAL] >= pub.refused
    assert metrics[OVERFLOW] == 0
    fwd = cluster.routing("n1")["fwd"]
    assert fwd["lost"] == 0 and fwd["dropped_by_mosquitto"] == 0, fwd
    sub.close()


def test_a_sidecar_behind_by_backlog_max_copies_sheds_until_it_has_taken_them(
        cluster_factory):
    """`overload.backlog_max` set to 800: the origin sidecar stops taking copies (frozen)
    while traffic flows; once about 800 wait for it in Mosquitto the plugin disconnects the
    publisher. When the sidecar resumes and reports what it took, publishing resumes; nothing
    acknowledged is lost. (A slow *peer* does not cause this: copies it has not confirmed
    within 0.5 s are stored on disk and acknowledged.)"""
    cluster = cluster_factory(2, env={"MQFED_OVERLOAD_BACKLOG_MAX": "800"})
    conf = (cluster.run_dir / "nodes" / "n1" / "mosquitto.conf").read_text()
    assert "plugin_opt_fwd_backlog_max 800" in conf.splitlines()
    count = 4000
    sub = _subscriber(cluster, "behind/x")
    pub = RetryingPublisher(cluster.ports["n1"], "behind/x", count, pause=0.0005)
    pub.start()
    try:
        wait_for(lambda: pub.acked > 200, 20, "traffic flowing")
        time.sleep(1.5)  # the sidecar reported what it took (the plugin's estimate is low)
        assert pub.refused == 0, "no shedding while the cluster keeps up"
        assert cluster.routing("n1")["overload"]["plugin_backlog"] < 800
        assert cluster.metrics("n1")[("mqfed_forward_backlog", ())] < 800
        sidecar = cluster.state("n1")["pid"]
        os.kill(sidecar, signal.SIGSTOP)
        try:
            behind_from = pub.acked
            wait_for(lambda: pub.refused >= 1, 30, "the publisher shed")
            # at most 800 copies wait (fewer were new since the freeze: those routed after
            # the sidecar's last report, every 0.5 s, count from the report)
            assert 0 < pub.acked_at_refusal[0] - behind_from <= 800, (
                behind_from, pub.acked_at_refusal)
        finally:
            os.kill(sidecar, signal.SIGCONT)
        pub.join(120)
    finally:
        pub.halt.set()
    assert pub.acked == count, f"publisher stuck at {pub.acked} ({pub.refused} refusals)"
    wait_for(lambda: len(set(values(sub))) >= count, 60, "every acknowledged message")
    check_sequence(values(sub), count)
    metrics = cluster.metrics("n1")
    assert metrics[SHED_TOTAL] >= 1 and metrics[OVERFLOW] == 0
    wait_for(lambda: cluster.routing("n1")["overload"]["publishers_shed"] >= 1, 10,
             "the sidecar learning the plugin's count")
    assert cluster.metrics("n1")[("mqfed_overload_shedding", ())] == 0
    sub.close()
