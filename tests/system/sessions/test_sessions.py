"""Persistent sessions follow their client across nodes (issue 17), on a real 3-node cluster.

A session made on one node resumes on any other, directly or through the round-robin front:
session present, its subscriptions, and every message queued for it meanwhile, in order. A
connect of the same client id anywhere takes over the older connection everywhere, and a
clean start anywhere discards the old session on every node.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.harness.procs import wait_for
from tests.system.cluster.conftest import mqfed
from tests.system.sessions.clients import Device, publish


def _session(cluster, node: str, topic: str, v5: bool = True, qos: int = 1) -> Device:
    """A persistent session on `node` subscribed to `topic` at `qos`, then offline."""
    dev = Device(f"dev-{time.time_ns()}", v5=v5)
    dev.connect(cluster.ports[node], clean=v5)  # v5: a new session that outlives this connect
    dev.subscribe(topic, qos)
    cluster.wait_interest(node, topic)
    dev.leave()
    return dev


@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
@pytest.mark.parametrize("via", ["direct", "front"])
def test_a_session_resumes_on_another_node_with_what_it_missed(shared_cluster, v5, via):
    cluster = shared_cluster
    topic = f"resume/{via}/{'v5' if v5 else 'v311'}"
    dev = _session(cluster, "n1", topic, v5)
    publish(cluster.ports["n2"], topic, 200)
    port = cluster.ports["n3"] if via == "direct" else cluster.front
    assert dev.connect(port) is True, "session present"
    got = dev.wait_count(200)
    assert got == list(range(200)), f"got {len(got)}: {got[:5]}...; missing " \
        f"{sorted(set(range(200)) - set(got))[:10]}"
    publish(cluster.ports["n1"], topic, 10, start=200)  # its subscription is still there
    assert dev.wait_count(210)[200:] == list(range(200, 210))
    dev.leave()
    if via == "direct":  # n3 made the session and received n1's queue
        metrics = cluster.metrics("n3")
        assert metrics[("mqfed_session_moves_total", ())] >= 1
        assert metrics[("mqfed_session_queued_messages_total",
                        (("outcome", "received"),))] >= 200


def _twenty_moves(cluster, dev: Device, topic: str, qos: int, front: bool = False,
                  publish_on: tuple[str, ...] = ("n2",), pause: float = 0.0,
                  moves: int = 20, every: float = 0.3, catch_up: float = 0.0,
                  after_connect: Callable[[], None] | None = None) -> list[int]:
    """The client reconnects 20 times, each time to the next node (or through the round-robin
    front), while a publisher on each of `publish_on` sends messages at `qos` (~350/s each,
    or 20 every `pause` s at most; numbered from 1,000,000 × its place); returns what was
    sent. `after_connect` runs after each of the client's connects.

    With `catch_up`, after each connect the client stays (up to that many seconds) until it
    has every message acknowledged to its publisher before that connect, then `every` more:
    a client that always leaves before its old queue reaches it (a move every 0.3 s through
    the front, ~2 s out each time) makes that queue chase it from node to node, growing,
    until it passes `max_queued_messages` (docs/architecture.md, "Known limits")."""
    dev.connect(cluster.ports["n1"])
    stop, sent = threading.Event(), []
    received = _Received(dev)

    def traffic(node: str, i: int) -> None:
        while not stop.is_set():
            publish(cluster.ports[node], topic, 20, qos=qos, start=i)
            sent.extend(range(i, i + 20))
            i += 20
            time.sleep(pause)

    publishers = [threading.Thread(target=traffic, args=(node, k * 1_000_000))
                  for k, node in enumerate(publish_on)]
    for publisher in publishers:
        publisher.start()
    order = ["n2", "n3", "n1"] * (moves // 3 + 1)
    try:
        for node in order[:moves]:
            time.sleep(every)
            dev.leave()
            port = cluster.front if front else cluster.ports[node]
            assert dev.connect(port) is True, f"session present on {'the front' if front else node}"
            if catch_up:
                received.wait_for(list(sent), catch_up)
            if after_connect is not None:
                after_connect()
    finally:
        stop.set()
        for publisher in publishers:
            publisher.join(30)
    return sent


class _Received:
    """What a device got so far, read incrementally (its list only grows)."""

    def __init__(self, dev: Device) -> None:
        self.dev, self.read, self.seen = dev, 0, set()

    def wait_for(self, numbers: list[int], timeout: float) -> bool:
        """Until the device got every one of `numbers`, at most `timeout` s."""
        missing = set(numbers)
        deadline = time.monotonic() + timeout
        while True:
            upto = len(self.dev.messages)
            self.seen.update(int(m.payload) for m in self.dev.messages[self.read:upto])
            self.read = upto
            missing -= self.seen
            if not missing or time.monotonic() >= deadline:
                return not missing
            time.sleep(0.02)


def _session_counts(cluster) -> dict[str, dict]:
    keys = ("backlog_sent", "backlog_received", "backlog_failed", "sync_timeouts", "failures",
            "drained", "moves", "unreleased_sent", "unreleased_received", "unreleased_refused",
            "ordered_moves", "order_timeouts", "order_moved_on", "order_chained",
            "settle_waited", "settle_waits_expired", "own_cut_timeouts", "claims_won",
            "claims_lapsed")
    return {n: {k: v for k, v in (cluster.state(n).get("cluster_sessions") or {}).items()
                if k in keys} for n in ("n1", "n2", "n3")}


def _grew(cluster, before: dict[str, dict], keys: tuple[str, ...]) -> dict[str, int]:
    """How much each session counter of `keys` grew, summed over the nodes, since `before`
    (`_session_counts`)."""
    now = _session_counts(cluster)
    return {k: sum(c.get(k, 0) for c in now.values()) - sum(c.get(k, 0) for c in before.values())
            for k in keys}


def _twice_on_one_connection(dev: Device) -> list[bytes]:
    """Messages the client got twice on one connection: the old node's queue and the new
    node's live hold both had them (what a move's cut mode rules out); a message it got on the
    connection it left and again on the next one was in flight at the disconnect (QoS 1 sends
    those again, as one broker does; QoS 2 those whose PUBCOMP was lost)."""
    seen, twice = set(), []
    for conn, payload in dev.deliveries:
        if (conn, payload) in seen:
            twice.append(payload)
        seen.add((conn, payload))
    return twice


def _breaks(seq: list[int]) -> int:
    """Order breaks in the first arrival of each number (a duplicate is not one)."""
    firsts = list(dict.fromkeys(seq))
    return sum(1 for a, b in zip(firsts, firsts[1:], strict=False) if b < a)


@pytest.mark.parametrize("via", ["direct", "front"])
def test_twenty_moves_under_qos1_traffic_lose_nothing(shared_cluster, via):
    """The client reconnects 20 times, each time to the next node 0.3 s after it got what was
    sent before its connect, while a publisher on n2 sends QoS 1 messages (~350/s): session
    present every time, nothing lost, per-publisher order kept (the new node gives the client
    the old queue before what reached it meanwhile). Duplicates happen only inside the
    handover window (docs/architecture.md §5: from the client's connect on the new node to
    the old node holding its copy): counted and printed; bounded here only against a copy of
    everything."""
    cluster = shared_cluster
    topic = f"moves/q1/{via}"
    dev = _session(cluster, "n1", topic)
    before = _session_counts(cluster)
    sent = _twenty_moves(cluster, dev, topic, 1, front=via == "front", catch_up=5.0)
    # a handover retried on a loaded machine (a backlog frame times out after 10 s, then the
    # drain is retried) arrives late, not never
    got = dev.wait_count(len(set(sent)), timeout=30)
    missing = sorted(set(sent) - set(got))
    dups = len(got) - len(set(got))
    breaks = _breaks(got)
    counts = _session_counts(cluster)
    twice = _twice_on_one_connection(dev)
    grew = _grew(cluster, before, ("order_timeouts", "order_moved_on", "order_chained",
                                   "settle_waited", "settle_waits_expired"))
    print(f"20 moves ({via}): {len(sent)} sent, {dups} duplicates ({len(twice)} on one "
          f"connection), {breaks} order breaks, {dev.connects.count(True)} connects with "
          f"session present; {grew}")
    assert not missing, f"lost {len(missing)} of {len(sent)}: {missing[:10]}; {counts}"
    assert dev.connects.count(True) == 21, dev.connects
    # a move soon after the client caught up: one that comes before the last one's
    # hand-over settled waits for it (the client is kept out and retries), so every move is
    # in cut mode and in order; duplicates only of what was in flight at a disconnect (sent
    # again on the next connection, as one broker does), unless a wait or hold timed out
    outran = grew["order_timeouts"] + grew["order_moved_on"] + grew["order_chained"]
    assert not breaks or outran, (breaks, grew)
    assert not twice or outran, (twice[:10], grew)
    dev.leave()


@pytest.mark.parametrize("qos", [1, 2])
def test_a_client_moving_under_traffic_gets_every_message_in_publish_order(shared_cluster, qos):
    """Six moves 1.5 s apart under ~350 msgs/s: the new node keeps what reaches the client
    (a live hold) until the old node's whole queue is in, so the client gets that queue
    first, as from one broker (before: the old queue came after the live messages, 16 order
    breaks over 20 moves). Unless a hold gave up waiting (its old node slower than 5 s), or
    the client left the new node before the old queue got there (moves faster than
    hand-overs: the test above), nothing comes out of order; duplicates only in the window."""
    cluster = shared_cluster
    topic = f"moves/order/{qos}/{time.time_ns()}"
    dev = _session(cluster, "n1", topic, qos=qos)
    before = _session_counts(cluster)
    sent = _twenty_moves(cluster, dev, topic, qos, moves=6, every=1.5)
    got = dev.wait_count(len(set(sent)), timeout=30)
    missing = sorted(set(sent) - set(got))
    breaks = _breaks(got)
    counts = _session_counts(cluster)
    grew = _grew(cluster, before, ("ordered_moves", "order_timeouts", "order_moved_on",
                                   "order_chained", "moves"))
    twice = _twice_on_one_connection(dev)
    print(f"6 moves at QoS {qos}: {len(sent)} sent, {len(got) - len(set(got))} duplicates "
          f"({len(twice)} on one connection), {breaks} order breaks; {grew}")
    assert not missing, f"lost {len(missing)} of {len(sent)}: {missing[:10]}; {counts}"
    # (the state files lag a little; a hand-over slower than the 1.5 s between moves, on a
    # loaded machine, counts as moved_on)
    assert grew["ordered_moves"] + grew["order_moved_on"] + grew["order_timeouts"] \
        + grew["order_chained"] >= 5, grew
    assert not breaks or grew["order_timeouts"] + grew["order_moved_on"] > 0, (breaks, grew)
    # each move in cut mode (docs/architecture.md §5): what the old node's queue and the new
    # node's live hold both had reaches the client once (before: 20-60 twice per run)
    assert not twice or grew["order_timeouts"] + grew["order_moved_on"] \
        + grew["order_chained"] > 0, (twice[:10], grew)
    dev.leave()


def test_no_local_holds_for_a_client_publishing_while_it_moves(shared_cluster):
    """A client with a No Local subscription publishes to its topic right after each of six
    connects, while a publisher on n2 goes on: it never gets its own messages back, though its
    old copy (offline until the old node holds it) is routed them from the new node (cut mode:
    the old copy refuses the new node's messages from that node's cut, which comes before any
    of them in that node's stream), and it gets every other message."""
    cluster = shared_cluster
    topic = f"moves/nolocal/{time.time_ns()}"
    dev = Device(f"dev-{time.time_ns()}")
    dev.connect(cluster.ports["n1"], clean=True)
    dev.subscribe_v5(topic, SubscribeOptions(qos=1, noLocal=True), 7)
    cluster.wait_interest("n1", topic)
    dev.leave()
    own: list[int] = []

    def publish_own() -> None:
        for _ in range(20):
            n = 9_000_000 + len(own)
            info = dev.client.publish(topic, str(n), qos=1)
            info.wait_for_publish(5)
            assert info.rc == mqtt.MQTT_ERR_SUCCESS
            own.append(n)

    sent = _twenty_moves(cluster, dev, topic, 1, moves=6, every=1.0, after_connect=publish_own)
    got = dev.wait_count(len(set(sent)), timeout=30)
    time.sleep(1.0)  # anything late
    back = sorted(set(dev.payloads()) & set(own))
    missing = sorted(set(sent) - set(got))
    print(f"No Local over 6 moves: {len(own)} own messages, {len(back)} came back; "
          f"{len(sent)} others, {len(missing)} missing")
    assert len(own) == 120 and not back, back[:10]
    assert not missing, missing[:10]
    dev.leave()


def test_a_qos0_subscriber_moving_under_traffic_never_gets_a_message_twice(shared_cluster):
    """QoS 0 across moves, as from one broker: what is published while the client is away is
    dropped, nothing comes twice or out of order (before: the old node's drain shadow took
    messages the new node's live hold also kept, 1-3 duplicates and breaks per run)."""
    cluster = shared_cluster
    topic = f"moves/q0/{time.time_ns()}"
    dev = _session(cluster, "n1", topic, qos=0)
    dev.connect(cluster.ports["n1"])
    pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id=f"q0pub-{time.time_ns()}", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", cluster.ports["n2"])
    pub.loop_start()
    stop, sent = threading.Event(), []

    def traffic() -> None:  # one message every ~5 ms, steadily (bursts can miss the window)
        i = 0
        while not stop.is_set():
            pub.publish(topic, str(i), qos=0)
            sent.append(i)
            i += 1
            time.sleep(0.005)

    publisher = threading.Thread(target=traffic)
    publisher.start()
    try:
        for node in ["n2", "n3", "n1", "n2", "n3", "n1"]:
            time.sleep(0.4)
            dev.leave()
            assert dev.connect(cluster.ports[node]) is True, f"session present on {node}"
    finally:
        stop.set()
        publisher.join(30)
        pub.disconnect()
        pub.loop_stop()
    time.sleep(2.0)  # (what is still on its way)
    got = dev.payloads(topic)
    breaks = _breaks(got)
    print(f"6 moves at QoS 0: {len(sent)} sent, {len(set(got))} received, "
          f"{len(got) - len(set(got))} duplicates, {breaks} order breaks")
    assert len(got) == len(set(got)) and breaks == 0, (len(got) - len(set(got)), breaks)
    assert len(set(got)) > len(sent) // 2, "most messages reach the client while it is online"
    dev.leave()


def test_a_move_onwards_before_the_old_queue_arrived_waits_for_it_and_keeps_order(
        shared_cluster):
    """n1 -> n2 -> n3, the second connect before n1's queue (3,000 messages) reached n2,
    while a publisher on n3 goes on: n3 keeps the client out (no CONNACK; it retries) until
    n2 says the move settled, so the second move is an ordinary one (cut mode: nothing twice)
    and the client gets every publisher's messages in order. Should n2 take longer than the
    wait's bound (1.5 s), n3 admits the client and n2 takes n1's queue into its copy ahead of
    what its live hold kept before draining the lot to n3 (a chained move: in order too)."""
    cluster = shared_cluster
    topic = f"moves/chain/{time.time_ns()}"
    dev = _session(cluster, "n1", topic)
    publish(cluster.ports["n2"], topic, 3000)  # queued on n1 while its client is away
    before = _session_counts(cluster)
    stop, live = threading.Event(), []

    def traffic() -> None:  # a second publisher, numbered from 1,000,000
        i = 1_000_000
        while not stop.is_set():
            publish(cluster.ports["n3"], topic, 20, start=i)
            live.extend(range(i, i + 20))
            i += 20
            time.sleep(0.02)

    publisher = threading.Thread(target=traffic)
    publisher.start()
    try:
        time.sleep(0.3)
        assert dev.connect(cluster.ports["n2"]) is True, "session present on n2"
        dev.leave()  # gone on at once: n1's queue is still on its way to n2
        started = time.monotonic()
        assert dev.connect(cluster.ports["n3"]) is True, "session present on n3"
        took = time.monotonic() - started
        time.sleep(1.0)
    finally:
        stop.set()
        publisher.join(30)
    sent = list(range(3000)) + live
    got = dev.wait_count(len(sent), timeout=30)
    missing = sorted(set(sent) - set(got))
    assert not missing, f"lost {len(missing)} of {len(sent)}: {missing[:10]}"
    breaks = {"queued": _breaks([m for m in got if m < 1_000_000]),
              "live": _breaks([m for m in got if m >= 1_000_000])}
    keys = ("ordered_moves", "order_timeouts", "order_moved_on", "order_chained",
            "settle_waited", "settle_waits_expired")
    # n3 kept the client out until n2's move settled (the state files lag a little)
    wait_for(lambda: _grew(cluster, before, keys)["settle_waited"] > 0, 5, "a settle wait")
    grew = _grew(cluster, before, keys)
    dups = len(got) - len(set(got))
    print(f"move onwards: {len(sent)} sent, {dups} duplicates, order breaks {breaks}, "
          f"{dev.attempts} connect attempts, connected on n3 after {took:.2f} s; {grew}")
    # the wait is bounded (1.5 s from the connect on n2), and the client's retries are quick
    assert took < 3.0, took
    assert breaks == {"queued": 0, "live": 0} or grew["order_timeouts"] > 0, (breaks, grew)
    if not grew["settle_waits_expired"]:
        assert grew["order_chained"] == 0 and dups == 0, (dups, grew)
    dev.leave()


def test_twenty_moves_under_qos2_traffic_release_what_waited_for_its_pubrel(shared_cluster):
    """The same at QoS 2. A message the client had acknowledged with PUBREC on the node it
    left, but not yet seen released, gets its PUBREL from the new node (plugin `inflight.c`:
    the PUBREL alone when the old node had read the PUBREC, else the PUBLISH again under the
    same packet id first): nothing lost (before, about one such message per move was, since
    paho hands a QoS 2 message over at its PUBREL). Exactly once: nothing twice unless a move
    outran its hand-over (chained, moved on, timed out: not in cut mode)."""
    cluster = shared_cluster
    topic = f"moves/q2/{time.time_ns()}"
    dev = _session(cluster, "n1", topic, qos=2)
    before = _session_counts(cluster)
    sent = _twenty_moves(cluster, dev, topic, 2, catch_up=5.0)
    got = dev.wait_count(len(set(sent)), timeout=30)
    missing = sorted(set(sent) - set(got))
    counts = _session_counts(cluster)
    assert not missing, f"lost {len(missing)} of {len(sent)}: {missing[:10]}; {counts}"
    released = sum(c.get("unreleased_received", 0) for c in counts.values())
    assert released > 0, f"no move found a message between PUBREC and PUBREL: {counts}"
    assert released <= sum(cluster.metrics(n)[("mqfed_session_unreleased_messages_total",
                                               (("outcome", "received"),))]
                           for n in ("n1", "n2", "n3"))  # (the state file lags a little)
    # a message stored at a PUBLISH on one connection and handed over on a later one got its
    # PUBREL there: alone if the old node had read its PUBREC, else after the same PUBLISH
    # again under the same packet id (besides, maybe, a copy of the handover window)
    delivered_on = {}
    for conn, payload in dev.deliveries:
        delivered_on.setdefault(payload, conn)
    first: dict[bytes, tuple[int, int]] = {}
    again: dict[bytes, set[int]] = {}
    for conn, mid, payload in dev.publishes:
        if payload not in first:
            first[payload] = (conn, mid)
        elif conn > first[payload][0]:
            again.setdefault(payload, set()).add(mid)
    waited = [p for p, (conn, _) in first.items() if delivered_on.get(p, conn) > conn]
    alone = [p for p in waited if p not in again]
    same = [p for p in waited if p in again and first[p][1] in again[p]]
    print(f"20 moves at QoS 2: {len(sent)} sent, {len(got) - len(set(got))} duplicates; "
          f"{released} released on the new node, {len(waited)} seen waiting for their PUBREL "
          f"across a move: {len(alone)} got the PUBREL alone, {len(same)} the PUBLISH again "
          f"under the same packet id")
    dups = len(got) - len(set(got))
    grew = _grew(cluster, before, ("order_timeouts", "order_moved_on", "order_chained"))
    assert not dups or sum(grew.values()) > 0, (dups, grew)
    # an id still in use on the new node goes with a new id (a random start makes that rare:
    # about 0.2 % of moves); the client still gets the message once
    assert waited and len(alone) + len(same) >= len(waited) - 2, \
        [(p, first[p], again.get(p)) for p in waited if p not in same and p not in alone][:5]
    dev.leave()


@pytest.mark.parametrize("via", ["direct"])
def test_back_to_back_moves_at_qos2_are_exactly_once_and_in_order(shared_cluster, via):
    """Nine moves with no pause between them (the client connects to the next node, or
    through the round-robin front, as soon as it has its CONNACK) under ~350 QoS 2 msgs/s: a
    connect that comes before the last move's hand-over settled is kept out until it did (it
    retries), so no move outruns a hand-over: nothing lost, nothing twice, nothing out of
    order."""
    cluster = shared_cluster
    topic = f"moves/q2/b2b/{via}/{time.time_ns()}"
    dev = _session(cluster, "n1", topic, qos=2)
    before = _session_counts(cluster)
    sent = _twenty_moves(cluster, dev, topic, 2, moves=9, every=0.0, front=via == "front")
    got = dev.wait_count(len(set(sent)), timeout=30)
    missing = sorted(set(sent) - set(got))
    keys = ("ordered_moves", "order_timeouts", "order_moved_on", "order_chained",
            "settle_waited", "settle_waits_expired")
    # moves kept waiting for the last one's hand-over (the state files lag a little)
    wait_for(lambda: _grew(cluster, before, keys)["settle_waited"] > 0, 5, "a settle wait")
    grew = _grew(cluster, before, keys)
    dups, breaks = len(got) - len(set(got)), _breaks(got)
    print(f"9 moves back to back at QoS 2 ({via}): {len(sent)} sent, {dups} duplicates, {breaks} "
          f"order breaks, {dev.attempts} connect attempts; {grew}")
    assert not missing, f"lost {len(missing)} of {len(sent)}: {missing[:10]}"
    outran = grew["order_timeouts"] + grew["order_moved_on"] + grew["order_chained"]
    assert not dups or outran, (dups, grew)
    assert not breaks or outran, (breaks, grew)
    dev.leave()


def test_back_to_back_moves_through_the_front_are_exactly_once_and_in_order(shared_cluster):
    """The same through the round-robin front (~130 msgs/s: a client that never stays makes
    its queue chase it, and at ~350 msgs/s, with ~3 s per move, it passed
    `max_queued_messages`): each denied attempt lands on the next node, which makes a copy
    too. Nothing is lost (before session 18: 1-443 of 280-720 in 3 of 4
    runs, a drain racing the client's reconnect to the draining node, and PUBRELs sent alone
    to a client that left before its PUBCOMP). Nothing twice and nothing out of order: such
    copies admit the client only under a claim every peer granted, so no two nodes take a
    reconnect for their own within the milliseconds a record travels (before the claims,
    session 19: up to 140 duplicates and 4 order breaks in 8 of 18 runs)."""
    cluster = shared_cluster
    topic = f"moves/q2/b2b-front/{time.time_ns()}"
    dev = _session(cluster, "n1", topic, qos=2)
    before = _session_counts(cluster)
    sent = _twenty_moves(cluster, dev, topic, 2, moves=9, every=0.0, front=True, pause=0.1)
    got = dev.wait_count(len(set(sent)), timeout=30)
    missing = sorted(set(sent) - set(got))
    counts = _session_counts(cluster)
    grew = _grew(cluster, before, ("order_chained", "own_cut_timeouts", "order_timeouts",
                                   "order_moved_on", "claims_won", "claims_lapsed"))
    dups, breaks = len(got) - len(set(got)), _breaks(got)
    print(f"9 moves back to back through the front at QoS 2: {len(sent)} sent, {dups} "
          f"duplicates, {breaks} order breaks, {dev.attempts} connect attempts; {grew}")
    assert not missing, f"lost {len(missing)} of {len(sent)}: {missing[:10]}; {counts}"
    # a chained move (its client gone on before the old queue came) is in cut mode: its own
    # cut comes (it waited 5 s for none before, holding the client's messages meanwhile)
    assert grew["own_cut_timeouts"] == 0, grew
    assert grew["claims_won"] >= 9, grew  # every move here was claimed
    assert sum(cluster.metrics(n).get(("mqfed_session_claims_total", (("outcome", "won"),)), 0)
               for n in ("n1", "n2", "n3")) >= 9
    outran = grew["order_timeouts"] + grew["order_moved_on"] + grew["order_chained"]
    assert not dups or outran, (dups, grew)
    assert not breaks or outran, (breaks, grew)
    dev.leave()


def test_a_connect_anywhere_takes_over_the_older_connection(shared_cluster):
    cluster = shared_cluster
    old = Device(f"tk-{time.time_ns()}", expiry=0)
    old.client.reconnect_delay_set(30, 60)  # no quick reconnect that would take it back
    old.connect(cluster.ports["n1"], clean=True)
    new = Device(old.client_id, expiry=0)
    new.connect(cluster.ports["n2"], clean=True)
    assert old.closed.wait(1.0), "the older connection on n1 was not closed within 1 s"
    time.sleep(0.5)
    assert not new.closed.is_set(), "the newer connection was closed"
    new.leave()
    old.leave()


def test_simultaneous_connects_on_two_nodes_settle_on_one(shared_cluster):
    cluster = shared_cluster
    cid = f"sim-{time.time_ns()}"
    a, b = Device(cid, expiry=0), Device(cid, expiry=0)
    for dev in (a, b):
        dev.client.reconnect_delay_set(30, 60)
    threads = [threading.Thread(target=d.connect, args=(cluster.ports[n], True))
               for d, n in ((a, "n1"), (b, "n3"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    wait_for(lambda: a.closed.is_set() or b.closed.is_set(), 3, "one of the two closed")
    time.sleep(1.0)
    assert a.closed.is_set() != b.closed.is_set(), "exactly one connection must remain"
    a.leave()
    b.leave()


def test_a_clean_start_anywhere_discards_the_session_everywhere(shared_cluster):
    cluster = shared_cluster
    topic = "clean/x"
    dev = _session(cluster, "n1", topic)
    assert dev.connect(cluster.ports["n2"], clean=True) is False
    dev.leave()

    def n1_holds_it() -> bool:  # the old session (n1 may hold a replica of the new one)
        held = cluster.state("n1").get("sessions", {}).get(dev.client_id)
        return held is not None and topic in held["subscriptions"]
    wait_for(lambda: not n1_holds_it(), 5, "n1 deleted its copy of the session")
    assert dev.connect(cluster.ports["n1"]) is True  # the new (empty) session, from n2
    publish(cluster.ports["n3"], topic, 5)
    time.sleep(1.0)
    assert dev.payloads() == [], "the discarded session's subscription still delivers"
    dev.leave()


def test_a_session_expires_once_everywhere(shared_cluster):
    """Session Expiry Interval 2 s, set anew in the DISCONNECT of a session made with 600 s:
    after it, no node offers the session (session present 0 anywhere) and none keeps it."""
    cluster = shared_cluster
    dev = _session(cluster, "n1", "expire/x")
    dev.connect(cluster.ports["n1"])
    props = Properties(PacketTypes.DISCONNECT)
    props.SessionExpiryInterval = 2
    dev.client.disconnect(properties=props)
    dev.client.loop_stop()
    wait_for(lambda: dev.client_id not in cluster.state("n1").get("sessions", {}), 10,
             "n1's Mosquitto expired the session")
    for node in ("n2", "n3"):
        wait_for(lambda n=node: dev.client_id not in
                 (cluster.state(n).get("cluster_sessions") or {}).get("clients", []), 5,
                 f"{node} forgot the session")
    assert dev.connect(cluster.ports["n2"]) is False, "an expired session was offered"
    dev.leave()


def test_a_resumed_session_keeps_subscription_options_and_gets_no_retained_again(
        shared_cluster):
    """No Local, Retain As Published and the subscription identifier as the client made them
    on n1, on the session resumed on n3; the retained message it got when it subscribed is not
    sent again (the session is made there with Retain Handling 2)."""
    cluster = shared_cluster
    topic = f"opts/{time.time_ns()}"
    retained = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                           client_id=f"ret-{time.time_ns()}", protocol=mqtt.MQTTv5)
    retained.connect("127.0.0.1", cluster.ports["n2"])
    retained.loop_start()
    retained.publish(f"{topic}/kept", "r", qos=1, retain=True).wait_for_publish(5)
    dev = Device(f"dev-{time.time_ns()}")
    dev.connect(cluster.ports["n1"], clean=True)
    dev.subscribe_v5(f"{topic}/#", SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True),
                     42)
    assert [m.topic for m in dev.wait_messages(1)] == [f"{topic}/kept"]
    cluster.wait_interest("n1", f"{topic}/#")
    dev.leave()
    dev.messages.clear()
    time.sleep(0.5)  # the options reach the registry everywhere
    retained.publish(f"{topic}/queued", "q", qos=1).wait_for_publish(5)  # queued on n1

    def drained() -> int:
        return (cluster.state("n1").get("cluster_sessions") or {}).get("drained", 0)
    before = drained()
    assert dev.connect(cluster.ports["n3"]) is True, "session present"
    queued = dev.wait_messages(1)
    assert [(m.topic, m.properties.SubscriptionIdentifier) for m in queued] == [
        (f"{topic}/queued", [42])], "the queued message, with its subscription identifier"
    dev.messages.clear()
    # its own messages published inside the handover window can come back from the old copy
    # on n1 (No Local there compares with the forwarding client): publish after it
    wait_for(lambda: drained() > before, 10, "n1 handed its copy over")
    retained.publish(f"{topic}/new", "x", qos=1, retain=True).wait_for_publish(5)
    dev.client.publish(f"{topic}/mine", "own", qos=1).wait_for_publish(5)
    got = dev.wait_messages(1)
    time.sleep(1.0)  # nothing else arrives
    assert [(m.topic, m.retain) for m in dev.messages] == [(f"{topic}/new", True)], \
        "only the new message, with its retain flag (Retain As Published), not its own " \
        "(No Local), not the old retained one again"
    assert got[0].properties.SubscriptionIdentifier == [42]
    dev.leave()
    retained.publish(f"{topic}/kept", "", qos=1, retain=True).wait_for_publish(5)
    retained.publish(f"{topic}/new", "", qos=1, retain=True).wait_for_publish(5)
    retained.loop_stop()


def test_twenty_moves_of_a_shared_member_under_traffic_on_every_node_lose_nothing(
        shared_cluster):
    """A persistent session's only subscription is shared; it moves 20 times while every node
    publishes to the group. Before: 39-42 of ~2,450 lost per run, published on the node the
    client had just come to: its Mosquitto picked the held copy there (refused: 2.0.11 then
    drops the group's message) or the forwarding client, whose peer had just given up the
    group (the copy was ignored as stale). Now a held copy takes its groups' picks and a
    forwarding copy no peer takes goes to a local member."""
    cluster = shared_cluster
    topic = f"moves/shared/{time.time_ns()}"
    dev = Device(f"shm-{time.time_ns()}")
    dev.connect(cluster.ports["n1"], clean=True)
    dev.subscribe(f"$share/workers/{topic}", 1)
    time.sleep(0.5)  # every peer's interest
    dev.leave()
    # ~150 messages/s per node: at ~1,000/s in all, with a move every 0.3 s, drains began to
    # fail in a cascade (docs/architecture.md §5, "Shared subscriptions")
    sent = _twenty_moves(cluster, dev, topic, 1, publish_on=("n1", "n2", "n3"), pause=0.1)
    got = dev.wait_count(len(set(sent)), timeout=30)
    missing = sorted(set(sent) - set(got))
    print(f"20 moves of a shared member: {len(sent)} sent, {len(got) - len(set(got))} "
          f"duplicates")
    assert not missing, f"lost {len(missing)} of {len(sent)}: {missing[:10]}; " \
        f"{_session_counts(cluster)}"
    dev.leave()


def test_a_persistent_shared_subscriber_gets_every_message_of_its_group(shared_cluster):
    """Its session's replica on another node is no member of the group: before, that node's
    Mosquitto took a share of what was published there and refused it (the replica is held
    while its client is online), and peers routed a share there, queued where the client was
    not: the client got 15 of every 30, from every node."""
    cluster = shared_cluster
    topic = f"shared/persistent/{time.time_ns()}"
    dev = Device(f"shp-{time.time_ns()}")

    def replicated() -> bool:
        out = mqfed("ctl", "--run-dir", str(cluster.run_dir), "sessions", "--client",
                    dev.client_id, "--json")
        return out.returncode == 0 and any(s["here"].startswith("replica")
                                           for s in json.loads(out.stdout)["sessions"])
    dev.connect(cluster.ports["n1"], clean=True)
    dev.subscribe(f"$share/workers/{topic}", 1)
    wait_for(replicated, 10, "the session's replica")
    time.sleep(0.5)  # every peer's interest settled
    for i, node in enumerate(("n1", "n2", "n3")):
        publish(cluster.ports[node], topic, 30, start=100 * i)
    expected = [100 * i + k for i in range(3) for k in range(30)]
    got = dev.wait_count(90)
    assert sorted(set(got)) == expected, \
        f"got {len(set(got))} of 90; missing {sorted(set(expected) - set(got))[:10]}"
    dev.leave()


def test_a_shared_subscriptions_identifier_and_options_follow_the_session(shared_cluster):
    """A shared subscription made with an identifier on n1 has it on the session resumed on
    n3 (the plugin reads it from Mosquitto's shared tree), and a message published on n2
    reaches the member there with it (the group's pick is a targeted delivery, which now
    adds the member's identifier)."""
    cluster = shared_cluster
    topic = f"shopts/{time.time_ns()}"
    dev = Device(f"shdev-{time.time_ns()}")
    dev.connect(cluster.ports["n1"], clean=True)
    dev.subscribe_v5(f"$share/grp/{topic}", SubscribeOptions(qos=1, retainAsPublished=True), 43)
    dev.leave()
    time.sleep(0.5)  # the options reach the registry everywhere

    def drained() -> int:
        return (cluster.state("n1").get("cluster_sessions") or {}).get("drained", 0)
    before = drained()
    assert dev.connect(cluster.ports["n3"]) is True, "session present"
    wait_for(lambda: drained() > before, 10, "n1 handed its copy over")
    wait_for(lambda: ["grp", topic] in [r[:2] for r in cluster.state("n3").get("interest", [])],
             10, "n3's interest in the group")
    pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id=f"shpub-{time.time_ns()}", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", cluster.ports["n2"])
    pub.loop_start()
    try:
        pub.publish(topic, "x", qos=1).wait_for_publish(5)
        got = dev.wait_messages(1)
        assert [(m.topic, m.properties.SubscriptionIdentifier) for m in got] == [
            (topic, [43])], "its identifier"
    finally:
        pub.loop_stop()
        dev.leave()


def test_qos2_is_exactly_once_across_moves_and_a_later_move_delivers_nothing_again(
        shared_cluster):
    """QoS 2 messages queued while the client is offline: resumed on n2, then on n3, then
    back on n1, each time with what was published meanwhile: every message once, in order,
    and nothing delivered again by a later move."""
    cluster = shared_cluster
    topic = f"q2move/{time.time_ns()}"
    dev = _session(cluster, "n1", topic, qos=2)
    sent = 0
    for step, (publisher, target) in enumerate([("n3", "n2"), ("n1", "n3"), ("n2", "n1")]):
        publish(cluster.ports[publisher], topic, 100, qos=2, start=sent)
        sent += 100
        assert dev.connect(cluster.ports[target]) is True, f"move {step}: session present"
        got = dev.wait_count(sent)
        assert got == list(range(sent)), f"move {step}: {len(got)} messages, " \
            f"duplicates {len(got) - len(set(got))}, missing " \
            f"{sorted(set(range(sent)) - set(got))[:10]}"
        dev.leave()
    time.sleep(1.0)  # a late backlog would arrive now
    assert dev.payloads() == list(range(sent))


def test_a_delayed_will_is_not_sent_when_its_client_resumes_elsewhere_within_the_delay(
        shared_cluster):
    """As on one broker: a client that left with DISCONNECT 0x04 (its will, delayed 3 s) and
    resumes its session on another node within the delay sends no will (the drain's resume
    there cancels it); nor does one whose session expiry was 0 (no session moves: its old node
    cancels the will once it learns of the newer connect); one that does not come back
    does."""
    from paho.mqtt.reasoncodes import ReasonCode

    from tests.system.wills.clients import Subscriber, WillClient

    cluster = shared_cluster
    base = f"dwill/{time.time_ns()}"
    sub = Subscriber(cluster.ports["n3"], f"sub-{time.time_ns()}", f"{base}/#")
    cluster.wait_interest("n3", f"{base}/#")
    back = WillClient(cluster.ports["n1"], f"back-{time.time_ns()}", f"{base}/back", b"no",
                      delay=3, expiry=60)
    gone = WillClient(cluster.ports["n1"], f"gone-{time.time_ns()}", f"{base}/gone", b"yes",
                      delay=3, expiry=60)
    bare = WillClient(cluster.ports["n1"], f"bare-{time.time_ns()}", f"{base}/bare", b"no",
                      delay=3, expiry=0)
    try:
        for c in (back, gone, bare):
            c.client.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=4))
            assert c.down.wait(5)
            c.client.loop_stop()
        back.connect(cluster.ports["n2"], timeout=15)  # within the delay, on another node
        bare.connect(cluster.ports["n2"], timeout=15)
        wait_for(lambda: sub.messages(f"{base}/gone"), 15, "the will of the client gone")
        time.sleep(2.0)  # past the delay of the ones that came back
        assert not sub.messages(f"{base}/back"), "resumed within the delay: no will"
        assert not sub.messages(f"{base}/bare"), "back within the delay (expiry 0): no will"
        assert len(sub.messages(f"{base}/gone")) == 1
    finally:
        back.close()
        bare.close()
        sub.close()


def _ctl_sessions(cluster, client: str, *json_flag: str) -> tuple[int, str, str]:
    admin = next(n["admin"] for n in cluster.info["nodes"] if n["id"] == "n2")
    r = mqfed("ctl", "--node", admin, "--token-file", str(cluster.run_dir / "admin-token"),
              *json_flag, "sessions", "--client", client, timeout=60)
    return r.returncode, r.stdout, r.stderr


def test_ctl_sessions_shows_the_messages_queued_for_an_offline_session_per_node(shared_cluster):
    """The owner's Mosquitto counts what it routed to the offline session (plugin `queued`);
    the count is gone once the client is back and has them."""
    cluster = shared_cluster
    topic = f"queued/{time.time_ns()}"
    dev = _session(cluster, "n1", topic)

    def views() -> dict[str, dict]:
        code, out, err = _ctl_sessions(cluster, dev.client_id, "--json")
        assert code == 0, err
        return {s["node_id"]: s for s in json.loads(out)["sessions"]}

    publish(cluster.ports["n2"], topic, 30)
    wait_for(lambda: int(views()["n1"]["queued"]) == 30, 10, "n1 counts 30 queued")
    seen = views()
    assert seen["n1"]["here"] == "session" and seen["n1"]["owner"] == "n1"
    for node, view in seen.items():  # a replica that only keeps a ring queues nothing
        if view["here"] in ("", "replica-held", "online"):
            assert int(view["queued"]) == -1, (node, view)
    code, out, err = _ctl_sessions(cluster, dev.client_id)
    assert code == 0 and "n1:session(30)" in out, out + err

    assert dev.connect(cluster.ports["n1"]) is True
    assert dev.wait_count(30) == list(range(30))
    wait_for(lambda: views()["n1"]["here"] == "online", 10, "n1 holds it online")
    assert int(views()["n1"]["queued"]) == -1
    dev.leave()


def test_a_queue_larger_than_a_peer_frame_moves_whole_and_in_order(shared_cluster):
    """100 messages of 200 KB (20 MB) queued on n1 reach the client on n3: the old owner sends
    them in frames of at most 8 MiB, each delivered before the next."""
    cluster = shared_cluster
    topic = f"bigqueue/{time.time_ns()}"
    dev = _session(cluster, "n1", topic)
    pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id=f"bigpub-{time.time_ns()}", protocol=mqtt.MQTTv5)
    pub.connect("127.0.0.1", cluster.ports["n2"])
    pub.loop_start()
    try:
        infos = [pub.publish(topic, str(i).encode().ljust(200_000), qos=1)
                 for i in range(100)]
        for info in infos:
            info.wait_for_publish(30)
        assert all(i.is_published() for i in infos)
    finally:
        pub.disconnect()
        pub.loop_stop()

    def queued_on_n1() -> int:  # all 100 forwarded and queued there before the move
        code, out, err = _ctl_sessions(cluster, dev.client_id, "--json")
        assert code == 0, err
        return next(int(s["queued"]) for s in json.loads(out)["sessions"]
                    if s["node_id"] == "n1")
    wait_for(lambda: queued_on_n1() >= 100, 30, "n1 queued all 100")
    frames = cluster.state("n1")["cluster_sessions"]["backlog_frames"]
    assert dev.connect(cluster.ports["n3"]) is True
    assert dev.wait_count(100, timeout=60) == list(range(100))
    wait_for(lambda: cluster.state("n1")["cluster_sessions"]["backlog_frames"] >= frames + 3,
             10, "n1 sending the 20 MB in three frames or more")
    dev.leave()
