"""Cluster membership: the sans-IO view (`view`) and its etcd adapter (`etcd`)."""

from sidecar.membership.view import BadRecord, Change, MembershipView, NodeRecord

__all__ = ["BadRecord", "Change", "MembershipView", "NodeRecord"]
