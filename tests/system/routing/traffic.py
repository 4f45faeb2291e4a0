"""Steady QoS 1 traffic for fault tests, and the checks on what subscribers got."""

from __future__ import annotations

import threading
import time

from tests.system.node.mqtt import Client

__all__ = ["SteadyPublisher", "check_contiguous", "check_sequence", "values", "wait_arrivals"]


class SteadyPublisher:
    """One publisher sending payloads 0, 1, 2, ... on `topic` at QoS 1 and `rate` per second,
    from a thread, until `stop()` (which waits for every PUBACK)."""

    def __init__(self, port: int, topic: str, rate: float = 200.0, name: str = "") -> None:
        self.topic = topic
        self.rate = rate
        self.client = Client(port, name or f"steady-{topic.replace('/', '-')}")
        assert self.client.wait_connected(), f"publisher for {topic} could not connect"
        self.sent = 0
        self._infos: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"pub-{topic}")

    def start(self) -> SteadyPublisher:
        self._thread.start()
        return self

    def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            info = self.client.client.publish(self.topic, str(self.sent).encode(), qos=1)
            self._infos.append(info)
            self.sent += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def stop(self) -> int:
        """Stop sending; every message must have been acknowledged. Returns how many."""
        self._stop.set()
        self._thread.join(10)
        for info in self._infos:
            info.wait_for_publish(10)
        assert all(info.is_published() for info in self._infos), "a publish was not acked"
        self.client.close()
        return self.sent


def values(sub: Client, topic: str | None = None) -> list[int]:
    """The integer payloads `sub` received (on `topic`), in arrival order."""
    return [int(m.payload) for m in list(sub.messages) if topic is None or m.topic == topic]


def wait_arrivals(sub: Client, count: int, stall: float = 10.0, limit: float = 60.0) -> int:
    """Wait until `sub` got `count` distinct payloads, or got nothing new for `stall` seconds,
    or `limit` passed; returns how many distinct payloads arrived (the caller's check names
    what is missing)."""
    deadline = time.monotonic() + limit
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        got = len({m.payload for m in list(sub.messages)})
        if got >= count:
            return got
        if got != seen:
            seen, since = got, time.monotonic()
        elif time.monotonic() - since > stall:
            break
        time.sleep(0.1)
    return len({m.payload for m in list(sub.messages)})


def check_sequence(got: list[int], count: int) -> None:
    """All of 0..count-1 arrived, and first arrivals are in publish order."""
    missing = sorted(set(range(count)) - set(got))
    assert not missing, f"lost {len(missing)} of {count} messages, first {missing[:10]}"
    firsts: list[int] = []
    known: set[int] = set()
    for value in got:
        if value not in known:
            known.add(value)
            firsts.append(value)
    assert firsts == sorted(firsts), "per-publisher order broken"


def check_contiguous(got: list[int]) -> None:
    """A subscriber that joined or left mid-stream got an unbroken, ordered run, no doubles."""
    assert got, "nothing received"
    bad = next((i for i in range(1, len(got)) if got[i] != got[i - 1] + 1), None)
    assert bad is None, (f"gap, duplicate or reorder in {len(got)} messages from {got[0]}: "
                         f"... {got[max(0, bad - 3):bad + 3]} ... at position {bad}")


def publish_sequence(port: int, count: int, rate: float, topic: str,
                     client_id: str = "seq-pub") -> threading.Thread:
    """Publish payloads 0..count-1 at QoS 1 from one publisher, in a thread."""
    def run() -> None:
        pub = Client(port, f"{client_id}-{topic.replace('/', '-')}")
        assert pub.wait_connected()
        for i in range(count):
            pub.publish(topic, str(i).encode(), qos=1, wait=False)
            time.sleep(1.0 / rate)
        time.sleep(1.0)
        pub.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
