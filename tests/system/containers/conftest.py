"""Container tests: a Docker engine, the project's images, and clusters started per test.

The suite skips only when no engine can be reached (the reason says why; `make test` starts
one when it can, see deploy/docker/with-engine.sh), and says so loudly at the end of the run.
"""

from __future__ import annotations

import os

import docker.errors
import pytest

from tests.system.containers import dockercluster

_skipped: list[str] = []


def _engine_or_skip():
    if os.environ.get("MQFED_SKIP_CONTAINERS") == "1":
        _skipped.append("MQFED_SKIP_CONTAINERS=1 was set")
        pytest.skip("container tests skipped: MQFED_SKIP_CONTAINERS=1 was set")
    try:
        return dockercluster.engine()
    except docker.errors.DockerException as exc:
        why = os.environ.get("MQFED_ENGINE_UNAVAILABLE") or f"no Docker engine reachable: {exc}"
        _skipped.append(why)
        pytest.skip(f"container tests skipped: {why}")


@pytest.fixture(scope="session")
def engine():
    client = _engine_or_skip()
    try:
        yield client
    finally:
        left = dockercluster.sweep(client)
        if left:
            print(f"\nremoved containers/networks left by the container tests: {left}")
        client.close()


@pytest.fixture(scope="session")
def images(engine):
    """The project's images, built on demand; `make test` builds them first (MQFED_IMAGES_BUILT)
    so the build shows in its log. A developer running pytest directly gets a rebuild of what
    changed (cached layers)."""
    if os.environ.get("MQFED_IMAGES_BUILT") != "1" or dockercluster.missing_images(engine):
        dockercluster.build_images()
    missing = dockercluster.missing_images(engine)
    assert not missing, f"images not built: {missing}"
    return dockercluster.IMAGES


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(getattr(request.node, f"rep_{when}", None) is not None
               and getattr(request.node, f"rep_{when}").failed for when in ("setup", "call"))


@pytest.fixture
def cluster(request, engine, images):
    """A running 3-node cluster + etcd + HAProxy front; removed after the test."""
    c = dockercluster.Cluster(engine)
    try:
        c.start()
    except BaseException:
        print(c.logs())
        c.stop()
        raise
    try:
        yield c
    finally:
        if _failed(request):
            print(c.logs())
        c.stop()


def pytest_terminal_summary(terminalreporter):
    if dockercluster.STARTED:
        images = sorted({line.split()[0] for line in dockercluster.STARTED})
        terminalreporter.write_line(
            f"container tests: started {len(dockercluster.STARTED)} containers "
            f"({', '.join(images)}) and removed them; docker-compose projects: "
            f"{len(dockercluster.COMPOSE_PROJECTS)}", green=True)
    if _skipped:
        bar = "!" * 78
        terminalreporter.write_line(bar, red=True, bold=True)
        terminalreporter.write_line("CONTAINER TESTS DID NOT RUN: " + _skipped[0], red=True,
                                    bold=True)
        terminalreporter.write_line(bar, red=True, bold=True)
