"""Replicated retained messages (architecture §3.7): sans-IO cores and their adapters.

Cores: `entry` (values, versions, hashes), `index` (last-writer-wins index with bucket digests),
`replicator` (local writes, remote writes and the local Mosquitto kept in step), `antientropy`
(digest exchanges). Adapters: `sqlite` (durable index), `wire` (peer.proto), `service` (I/O).
"""
