"""Routing cores: the local subscription table (and, later, remote interest per peer)."""

from __future__ import annotations

from sidecar.routing.table import (
    InterestAdded,
    InterestChange,
    InterestKey,
    InterestRemoved,
    SessionInfo,
    SubscriptionTable,
)

__all__ = [
    "InterestAdded",
    "InterestChange",
    "InterestKey",
    "InterestRemoved",
    "SessionInfo",
    "SubscriptionTable",
]
