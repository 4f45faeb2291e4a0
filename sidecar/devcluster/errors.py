"""The one error type of the cluster commands."""


class ClusterError(RuntimeError):
    """A cluster command cannot go on; the message says what to do."""
