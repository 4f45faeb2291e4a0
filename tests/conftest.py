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


def _expected_skip(report: pytest.TestReport) -> bool:
    """A skip the run was told to expect: MQFED_ALLOW_SKIPS=1 (any), MQFED_SKIP_CONTAINERS=1
    (the container tests')."""
    if os.environ.get("MQFED_ALLOW_SKIPS") == "1":
        return True
    return (os.environ.get("MQFED_SKIP_CONTAINERS") == "1"
            and "MQFED_SKIP_CONTAINERS=1" in str(report.longrepr))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test that skips without being expected to fails the run: a skip hides a missing
    install step or engine as well as a pass would (issue 23). Skip reasons are listed by
    `-rs` (pyproject's addopts)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    unexpected = [r for r in reporter.stats.get("skipped", []) if not _expected_skip(r)]
    if unexpected:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter.ensure_newline()
        reporter.write_line(f"{len(unexpected)} test(s) skipped without being expected "
                            f"(first: {unexpected[0].nodeid}); install what they need, or "
                            "set MQFED_ALLOW_SKIPS=1 (MQFED_SKIP_CONTAINERS=1 for the "
                            "container tests)", red=True, bold=True)
