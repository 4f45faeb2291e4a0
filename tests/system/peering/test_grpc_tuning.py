"""sidecar.grpc_tuning: the setting is applied on import and takes effect in gRPC itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sidecar import grpc_tuning

PROBE = Path(__file__).with_name("grpc_threads_probe.py")


def probe(*args: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    done = subprocess.run(
        [sys.executable, str(PROBE), *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])["per_round_trip"]


def test_apply_sets_the_experiments_only_when_the_user_did_not() -> None:
    environ: dict[str, str] = {}
    assert grpc_tuning.apply(environ)
    assert environ["GRPC_EXPERIMENTS"] == grpc_tuning.GRPC_EXPERIMENTS
    mine = {"GRPC_EXPERIMENTS": "-some_experiment"}
    assert not grpc_tuning.apply(mine)
    assert mine == {"GRPC_EXPERIMENTS": "-some_experiment"}


def test_importing_the_sidecar_keeps_grpc_reads_off_the_event_engine_threads() -> None:
    """With gRPC's defaults each stream read wakes EventEngine threads; tuned, they stay idle.

    The untuned run is the control: it shows the probe can see the difference, so this test
    fails if a gRPC upgrade drops or renames the experiments (gRPC only logs unknown names).
    """
    default = probe()
    tuned = probe("--tuned")
    assert default >= 1.0, f"control: {default} EventEngine wakeups per round trip"
    assert tuned <= 0.2, f"tuned: {tuned} EventEngine wakeups per round trip (default {default})"
