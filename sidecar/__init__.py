"""The mqfed sidecar. Importing it applies gRPC's core settings before gRPC loads."""

import os as _os

from sidecar import grpc_tuning as _grpc_tuning

_grpc_tuning.apply()

if _os.environ.get("MQFED_DRILL_CLOCK_SKEW_MS"):  # fault drills only (sidecar.drill_clock)
    from sidecar import drill_clock as _drill_clock

    _drill_clock.apply(_os.environ["MQFED_DRILL_CLOCK_SKEW_MS"])
