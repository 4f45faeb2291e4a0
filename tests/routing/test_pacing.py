"""Drain pacing and linger (sidecar.routing.pacing), without sockets."""

from __future__ import annotations

import math

from sidecar.routing.pacing import (
    BACKLOG,
    BATCH_MESSAGES,
    DRAIN_RATE,
    LINGER,
    LINGER_BACKLOG,
    LINGER_BELOW,
    Pacing,
)


def test_live_traffic_is_unlimited():
    p = Pacing(max_queued=10_000)
    assert math.isinf(p.budget("n2", queued=10, plugin_backlog=0, now=0.0).messages)
    p.on_reconnected("n2", BACKLOG, 0.0)  # not more than BACKLOG: no drain
    assert not p.draining("n2")


def test_a_backlog_found_at_reconnect_drains_at_the_drain_rate_then_ends():
    p = Pacing(max_queued=10_000)
    p.on_reconnected("n2", BACKLOG + 1, 0.0)
    assert p.draining("n2")
    b = p.budget("n2", queued=5000, plugin_backlog=0, now=0.0)
    assert b.messages == BATCH_MESSAGES and not b.replay_started
    p.spent("n2", 0.0, 0.0)
    assert p.budget("n2", queued=5000, plugin_backlog=0, now=0.1).messages == DRAIN_RATE * 0.1
    p.spent("n2", 0.0, 0.1)
    assert p.budget("n2", 5000, 0, now=10.0).messages == DRAIN_RATE / 4  # capped burst
    assert math.isinf(p.budget("n2", queued=BACKLOG // 2, plugin_backlog=0, now=11.0).messages)
    assert not p.draining("n2")


def test_a_replay_out_of_mosquitto_is_paced_and_reported_once():
    p = Pacing(max_queued=10_000)
    assert p.replay_above == 8000
    first = p.budget("n2", queued=0, plugin_backlog=8001, now=0.0)
    assert first.replay_started and first.messages == DRAIN_RATE / 4
    assert not p.budget("n2", queued=0, plugin_backlog=8001, now=0.01).replay_started
    assert math.isinf(p.budget("n2", queued=0, plugin_backlog=3999, now=1.0).messages)
    assert Pacing(max_queued=0).replay_above == 0  # unlimited queues: no replay pacing
    assert math.isinf(Pacing(0).budget("n2", 0, 10**6, 0.0).messages)


def test_a_small_batch_lingers_only_while_the_origin_is_behind():
    p = Pacing(max_queued=10_000)
    assert p.linger("n2", unsent=1, plugin_backlog=LINGER_BACKLOG, now=0.0) is None
    assert p.linger("n2", unsent=LINGER_BELOW, plugin_backlog=10**4, now=0.0) is None
    assert p.linger("n2", unsent=1, plugin_backlog=10**4, now=0.0) == (LINGER, True)
    assert p.linger("n2", unsent=1, plugin_backlog=10**4, now=LINGER / 2) == (LINGER, False)
    assert p.linger("n2", unsent=1, plugin_backlog=10**4, now=LINGER) is None  # it leaves
    assert p.linger("n2", unsent=1, plugin_backlog=10**4, now=LINGER)[1]  # a new wait
    p.forget("n2")
    assert p.linger("n2", unsent=1, plugin_backlog=10**4, now=1.0) == (1.0 + LINGER, True)
