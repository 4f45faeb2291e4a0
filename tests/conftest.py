"""Shared fixtures: a process group per test whose logs are printed when the test fails."""

from __future__ import annotations

import os

# This process uses gRPC in-process (peering and admin tests) and later forks: pyspark starts
# its JVM launcher with a preexec_fn, so with fork(), not vfork(). gRPC's fork handlers exist
# for children that keep using gRPC, which none here does; with them, a fork while gRPC threads
# run once killed the child before exec ("Java gateway process exited before sending its port
# number", with gRPC's "skipping fork() handlers" just before). Set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.harness.procs import ProcessGroup


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def _test_failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "rep_call", None)
    setup = getattr(request.node, "rep_setup", None)
    return bool((rep and rep.failed) or (setup and setup.failed))


@pytest.fixture
def procs(request: pytest.FixtureRequest, tmp_path):
    """Start processes with `procs.start(name, argv)`; all are stopped by PID after the test."""
    group = ProcessGroup(tmp_path / "procs")
    try:
        yield group
    finally:
        group.stop_all()
        if _test_failed(request):
            print(group.dump_logs())


@pytest.fixture
def readable_dir():
    """A folder the `mosquitto` user can read (pytest's tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="mqfed-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
