"""Structured, quiet-by-default logging for the sidecar."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any `extra=` fields."""

    def __init__(self, node: str = "") -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.node:
            out["node"] = self.node
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, (int, float, str, bool, type(None))) \
                    else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str = "warning", fmt: str = "json", node: str = "",
                  debug: Iterable[str] = ()) -> None:
    """Configure the root logger once for a sidecar process; the `debug` loggers (and their
    children) log at DEBUG whatever `level` says."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(node))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {node} %(levelname)s %(name)s: "
                                               "%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(max(logging.WARNING, root.level))  # floods DEBUG
    for name in debug:
        logging.getLogger(name).setLevel(logging.DEBUG)
