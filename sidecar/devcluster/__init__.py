"""A local mqfed cluster on loopback: etcd, N nodes and an HAProxy front (`mqfed up`)."""
