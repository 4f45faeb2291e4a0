"""Issue 20's acceptance on the local cluster: under continuous QoS 1 traffic, with 100
persistent-session subscribers connected through the front, `mqfed rolling-restart` restarts
all 3 nodes; `mqfed audit` over the trace records finds nothing lost, every session resumes
with session present, and the duplicates are counted and printed."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.drain.traffic import (
    TracedDevice,
    TracedPublisher,
    new_writer,
    write_subscriptions,
)

SUBSCRIBERS = 100
RATE = 150.0  # messages per second over the 100 topics


def _audit(traces: Path) -> dict:
    pytest.importorskip("pyspark", reason="the pipeline extra is not installed (make install)")
    result = mqfed("audit", "--traces", str(traces), "--json", timeout=600)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return json.loads(result.stdout)


def test_rolling_restart_under_qos1_traffic_loses_nothing(own_cluster, tmp_path):
    cluster = own_cluster
    run = uuid.uuid4().hex[:6]
    traces = tmp_path / "traces"
    topics = [f"roll/{run}/{i}" for i in range(SUBSCRIBERS)]
    recv = new_writer(traces, f"recv-{run}")
    pubw = new_writer(traces, f"pub-{run}-0")
    devices = [TracedDevice(f"roll-{run}-{i}") for i in range(SUBSCRIBERS)]
    publisher = None
    try:
        for dev, topic in zip(devices, topics, strict=True):
            assert dev.connect(cluster.front) is False  # a new session
            dev.subscribe(topic, 1)
        publisher = TracedPublisher(cluster.front, topics, RATE, pubw, run)
        # routed everywhere: a warm-up message on every topic reaches its subscriber
        def warm() -> bool:
            cold = [t for d, t in zip(devices, topics, strict=True)
                    if not any(m.payload == b"warm-up" for m in d.messages)]
            for topic in cold:
                publisher.client.publish(topic, b"warm-up", qos=1)
            return not cold
        wait_for(warm, 30, "every subscriber's warm-up message", interval=0.5)
        write_subscriptions(recv, "sub", run, devices, topics)
        publisher.start()
        time.sleep(2)
        started = time.monotonic()
        result = mqfed("rolling-restart", "--run-dir", str(cluster.run_dir), "--json",
                       timeout=600)
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr[-3000:]
        steps = json.loads(result.stdout)
        assert [s["node"] for s in steps] == ["n1", "n2", "n3"]
        time.sleep(2)
        publisher.stop()
        assert len(publisher.acked) == len(publisher.sent), "publishes never acknowledged"
        expected = {t: {s for s, topic in publisher.sent.items() if topic == t} for t in topics}
        for dev, topic in zip(devices, topics, strict=True):
            try:
                wait_for(lambda d=dev, t=topic: d.seqs() >= expected[t], 20,
                         f"{dev.client_id}'s messages")
            except TimeoutError:
                pass  # the audit names what is missing
        write_subscriptions(recv, "unsub", run, devices, topics)
        copies = sum(dev.write_copies(recv, run) for dev in devices)
    finally:
        recv.close()
        pubw.close()
        if publisher is not None:
            publisher.close()
        for dev in devices:
            dev.leave()
    reconnects = [dev.connects[1:] for dev in devices]
    summary = _audit(traces)
    duplicates = sum(r["duplicates"] for r in summary["subscribers"])
    violations = len(summary["violations"])
    drains = ", ".join(f"{s['node']}: drain {s['drain_s']}s" for s in steps)
    print(f"rolling restart of 3 nodes in {took:.1f}s ({drains}); "
          f"{len(publisher.sent)} published, {copies} copies received, "
          f"{summary['lost']} lost, {duplicates} duplicates, {violations} ordering "
          f"violations (the handover window); "
          f"{sum(map(len, reconnects))} reconnects, all with session present")
    assert summary["records"]["pub"] == len(publisher.sent)
    assert summary["lost"] == 0, summary["lost_ranges"][:5]
    assert all(reconnects), "every subscriber was moved at least once"
    assert all(all(r) for r in reconnects), "a session did not resume (session present 0)"
