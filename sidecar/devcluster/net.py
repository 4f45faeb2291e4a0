"""Loopback port checks (adapter)."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable

from sidecar.devcluster.layout import HOST


def port_problem(port: int) -> str | None:
    """Why a server could not listen on HOST:`port` now (SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EACCES:
                return "not allowed for this user (ports below 1024 need root)"
            return "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
    return None


def port_free(port: int) -> bool:
    return port_problem(port) is None


def port_open(port: int) -> bool:
    """True if something accepts TCP connections on HOST:`port`."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def taken(ports: Iterable[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(port, purpose, problem) for every port a server could not listen on now."""
    out = []
    for port, what in ports:
        problem = port_problem(port)
        if problem:
            out.append((port, what, problem))
    return out
