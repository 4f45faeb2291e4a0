"""The sidecar's half of overload shedding: hysteresis, lease renewal, report cadence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.broker import conf as broker_conf
from sidecar.local.pressure import Backpressure, Report, shed_threshold


def test_shedding_starts_at_the_threshold_is_renewed_and_ends_below_the_lower_one():
    bp = Backpressure(100, 40, report_every=0.5, lease=5.0)
    assert bp.on_tick(0, 7, 0.0) == Report(0, 7, 0, False)        # first report at once
    assert bp.on_tick(99, 7, 0.1) is None                      # below, not due
    assert bp.on_tick(100, 7, 0.2) == Report(100, 7, 5000, True)  # at once, not waiting for 0.5 s
    assert bp.shedding and bp.episodes == 1
    assert bp.on_tick(60, 7, 0.3) is None
    assert bp.on_tick(60, 7, 0.75) == Report(60, 7, 5000, False)  # renewed while above 40
    assert bp.on_tick(39, 7, 0.8) == Report(39, 7, 0, True)       # ends at once
    assert not bp.shedding
    assert bp.on_tick(99, 7, 1.0) is None and bp.on_tick(99, 7, 1.35) == Report(99, 7, 0, False)
    assert bp.on_tick(100, 7, 1.4) == Report(100, 7, 5000, True) and bp.episodes == 2


def test_reports_come_every_tick_while_copies_flow():
    bp = Backpressure(100, 40, report_every=0.5, report_busy=0.05)
    assert bp.on_tick(0, 0, 0.0) is not None
    assert bp.on_tick(0, 500, 0.03) is None                        # too soon
    assert bp.on_tick(0, 700, 0.05) == Report(0, 700, 0, False)    # copies flowed
    assert bp.on_tick(0, 700, 0.10) is None                        # idle: every 0.5 s
    assert bp.on_tick(0, 700, 0.55) == Report(0, 700, 0, False)


def test_thresholds_default_and_checked():
    assert shed_threshold(16_384) == 4096 and shed_threshold(16_384, 50) == 50
    assert shed_threshold(4) == 2
    assert Backpressure(4096).resume_below == 2048
    with pytest.raises(ValueError, match="resume_below"):
        Backpressure(10, 10)
    with pytest.raises(ValueError, match="resume_below"):
        Backpressure(10, -1)


def test_the_plugins_count_survives_a_mosquitto_restart():
    bp = Backpressure(10)
    bp.on_reply(True, 3)
    bp.on_reply(True, 5)
    assert bp.publishers_shed == 5 and bp.plugin_shedding
    bp.on_reply(False, 1)   # a new plugin run counts from 0
    assert bp.publishers_shed == 6 and not bp.plugin_shedding
    assert bp.status()["publishers_shed"] == 6


def test_the_plugin_gets_its_backlog_limit_from_max_queued_messages_or_the_config():
    text = broker_conf.render(broker_conf.BrokerConfig(
        node_id="n1", plugin_path="/p.so", socket_path="/s", secret="x"))
    assert "plugin_opt_fwd_backlog_max 5000" in text.splitlines()
    text = broker_conf.render(broker_conf.BrokerConfig(
        node_id="n1", plugin_path="/p.so", socket_path="/s", secret="x", fwd_backlog_max=7))
    assert "plugin_opt_fwd_backlog_max 7" in text.splitlines()
    assert broker_conf.backlog_max_for(0) == 0 and broker_conf.backlog_max_for(100) == 100


@given(st.lists(st.tuples(st.integers(0, 300), st.floats(0.0, 2.0), st.integers(0, 50)),
                max_size=60),
       st.integers(2, 200))
def test_reports_follow_the_hysteresis_and_are_never_late(steps, high):
    low = high // 2
    bp = Backpressure(high, low, report_every=0.5, lease=3.0, report_busy=0.05)
    now, shedding, last_report, taken, reported_taken = 0.0, False, None, 0, 0
    for unacked, dt, new_copies in steps:
        now += dt
        taken += new_copies
        before = shedding
        if not shedding and unacked >= high:
            shedding = True
        elif shedding and unacked < low:
            shedding = False
        report = bp.on_tick(unacked, taken, now)
        assert bp.shedding == shedding
        if shedding != before:
            assert report is not None and report.changed
        if last_report is None or now - last_report >= 0.5:
            assert report is not None          # the plugin's silence count is reset in time
        if last_report is not None and taken != reported_taken and now - last_report >= 0.05:
            assert report is not None          # copies flow: the estimate follows closely
        if report is not None:
            assert report.shed_ms == (3000 if shedding else 0) and report.unacked == unacked
            assert report.taken == taken
            last_report, reported_taken = now, taken
        else:
            assert last_report is not None and now - last_report < 0.5
            assert taken == reported_taken or now - last_report < 0.05
