"""Persistent sessions that follow their client across nodes: the replicated registry (cores)
and the shadow connections that make, drain and delete sessions on Mosquitto (adapters)."""
