"""Issue 20's acceptance on the local cluster: under continuous QoS 1 traffic, with 100
persistent-session subscribers connected through the front, `mqfed rolling-restart` restarts
all 3 nodes; `mqfed audit` over the trace records finds nothing lost, every session resumes
with session present, and the duplicates are counted and printed. (The same on compose:
tests/system/containers/test_compose.py.)"""

from __future__ import annotations

import json

from tests.system.cluster.conftest import mqfed
from tests.system.drain.traffic import under_traffic


def test_rolling_restart_under_qos1_traffic_loses_nothing(own_cluster, tmp_path):
    cluster = own_cluster
    steps: list[dict] = []

    def restart() -> None:
        result = mqfed("rolling-restart", "--run-dir", str(cluster.run_dir), "--json",
                       timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        steps.extend(json.loads(result.stdout))

    outcome = under_traffic(cluster.front, restart, tmp_path / "traces")
    drains = ", ".join(f"{s['node']}: drain {s['drain_s']}s" for s in steps)
    print(f"rolling restart of 3 nodes ({drains}): {outcome.line()}")
    assert [s["node"] for s in steps] == ["n1", "n2", "n3"]
    assert outcome.summary["lost"] == 0, outcome.summary["lost_ranges"][:5]
    assert all(outcome.reconnects), "every subscriber was moved at least once"
    assert all(all(r) for r in outcome.reconnects), "a session did not resume"
