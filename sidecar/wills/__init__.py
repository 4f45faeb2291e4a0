"""Wills of clients whose node died (architecture §5, "Wills"): the replicated will table and
who publishes a dead node's wills (cores), and their adapters.

Cores: `record` (values, versions, due times), `liveness` (which nodes are confirmed dead),
`table` (the will table and its actions; it reads the session registry's latest connects
through `table.Connections`), with `sidecar.rendezvous` (the one survivor that acts for a
client). Adapters:
`sqlite` (durable table), `wire` (peer.proto), `service` (I/O).
"""
