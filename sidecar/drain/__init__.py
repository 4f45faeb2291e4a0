"""Draining a node (issue 20): `leave` is the graceful stop (SIGTERM), `progress` the sans-IO
core of a drain asked for through the admin API (`mqfed ctl drain`), `service` its adapter."""

from sidecar.drain.leave import DRAIN_TIMEOUT, QUIET, DrainResult, drain, settled

__all__ = ["DRAIN_TIMEOUT", "QUIET", "DrainResult", "drain", "settled"]
