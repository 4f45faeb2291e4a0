#!/opt/mqfed/bin/python
"""mqfed-health live|ready: exit 0 when the node in this container is alive / ready.

Asks the sidecar's HTTP health endpoints on its metrics listener first (`/healthz`,
`/readyz`, the paths the Kubernetes probes use). Where the sidecar does not serve them (an
older sidecar: connection refused or 404), it falls back to the node's status file
`<run_dir>/state.json`, which the sidecar rewrites at least twice a second: alive = the file
is fresh and the sidecar's PID in it runs; ready = alive and `"ready": true`.
Used by the image's HEALTHCHECK and by the container tests.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

STALE_AFTER = 10.0  # seconds without a status write: the sidecar is wedged or gone


def _metrics_port() -> int:
    value = os.environ.get("MQFED_ADMIN_METRICS", "0.0.0.0:9101")
    return int(value.rpartition(":")[2] or 9101) if value else 0


def http_answer(path: str) -> bool | None:
    """True/False from the sidecar's endpoint, None if it does not serve it."""
    port = _metrics_port()
    if not port:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return 200 <= reply.status < 300
    except urllib.error.HTTPError as exc:
        return None if exc.code == 404 else False
    except (OSError, ValueError):
        return None


def state_answer(ready: bool) -> tuple[bool, str]:
    run_dir = Path(os.environ.get("MQFED_NODE_RUN_DIR") or "/var/lib/mqfed")
    path = run_dir / "state.json"
    try:
        age = time.time() - path.stat().st_mtime
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return False, f"no status file: {exc}"
    if age > STALE_AFTER:
        return False, f"{path} not written for {age:.0f}s"
    pid = state.get("pid")
    if not pid or not Path(f"/proc/{pid}").exists():
        return False, f"sidecar pid {pid} not running"
    if ready and not state.get("ready"):
        return False, "node not ready yet"
    return True, "ok"


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "ready"
    if mode not in ("live", "ready"):
        print("usage: mqfed-health live|ready", file=sys.stderr)
        return 2
    answer = http_answer("/readyz" if mode == "ready" else "/healthz")
    if answer is not None:
        print(f"{mode}: {'ok' if answer else 'failing'} (http)")
        return 0 if answer else 1
    ok, why = state_answer(mode == "ready")
    print(f"{mode}: {why} (state.json)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
