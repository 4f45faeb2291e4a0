"""The admin service's methods: names, message types, and the field that merges across nodes."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar._proto import admin_pb2

__all__ = ["CHALLENGE", "METHODS", "SERVICE_NAME", "Method", "path"]

_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"]
SERVICE_NAME = _SERVICE.full_name  # "mqfed.admin.v1.Admin"


@dataclass(frozen=True)
class Method:
    name: str
    request: type
    reply: type
    rows: str  # the repeated field concatenated across nodes ("" if none)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("Status", admin_pb2.Query, admin_pb2.StatusReply, "statuses"),
    Method("Nodes", admin_pb2.Query, admin_pb2.NodesReply, ""),
    Method("Routes", admin_pb2.Query, admin_pb2.RoutesReply, "routes"),
    Method("Subscriptions", admin_pb2.Query, admin_pb2.SubscriptionsReply, "subscriptions"),
    Method("Clients", admin_pb2.Query, admin_pb2.ClientsReply, "clients"),
    Method("Sessions", admin_pb2.Query, admin_pb2.SessionsReply, "sessions"),
    Method("Retained", admin_pb2.Query, admin_pb2.RetainedReply, "entries"),
    Method("Trace", admin_pb2.TraceRequest, admin_pb2.TraceReply, "hops"),
    Method("TraceHops", admin_pb2.Query, admin_pb2.TraceHopsReply, "hops"),
    Method("Drain", admin_pb2.DrainRequest, admin_pb2.DrainReply, ""),
)}
assert set(METHODS) | {"Challenge"} == set(_SERVICE.methods_by_name), \
    "admin.proto and METHODS disagree"
CHALLENGE = f"/{SERVICE_NAME}/Challenge"
"""Unauthenticated: a server nonce for the proof of the next call (`sidecar.grpc_auth`)."""


def path(name: str) -> str:
    """The gRPC method path of `name`."""
    return f"/{SERVICE_NAME}/{name}"
