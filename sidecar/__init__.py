"""The mqfed sidecar. Importing it applies gRPC's core settings before gRPC loads."""

from sidecar import grpc_tuning as _grpc_tuning

_grpc_tuning.apply()
