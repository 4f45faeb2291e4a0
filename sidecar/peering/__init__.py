"""Peering: sidecar-to-sidecar streams. Pure cores (handshake, dedup, outbound queue) and the
SQLite spill adapter; the gRPC adapter lives next to them."""

from __future__ import annotations
