"""Wills of clients whose node died (architecture §5, "Wills"): the replicated will table and
who publishes a dead node's wills (cores), and their adapters.

Cores: `record` (values, versions, due times), `liveness` (which nodes are confirmed dead),
`rendezvous` (the one survivor that acts for a client), `table` (the will table and its
actions), `sessions_view` (the read-only view of the session registry it needs). Adapters:
`sqlite` (durable table), `wire` (peer.proto), `service` (I/O).
"""
