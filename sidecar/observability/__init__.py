"""Prometheus metrics and health endpoints of a sidecar (issue 6)."""
