"""The admin API (issue 6): gRPC service, cluster-wide fan-out, `mqfed ctl`, traces."""
