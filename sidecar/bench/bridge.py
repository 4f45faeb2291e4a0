"""The anchor: two stock Mosquitto brokers joined by a plain Mosquitto bridge (A → B).

Broker A bridges `bench/#` out to broker B at the benchmark's QoS; everything else is
Mosquitto's defaults, as for the mqfed nodes. Both run in their own session, are recorded by
PID (start time and config path checked) and stopped by PID.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from sidecar.devcluster.net import port_open
from sidecar.devcluster.procs import ProcRef, spawn, stop, tail

COMMON = """\
persistence false
allow_anonymous true
log_dest stderr
log_type error
log_type warning
log_type notice
listener {port} 127.0.0.1
"""

BRIDGE = """\
connection bench
address 127.0.0.1:{peer}
topic bench/# out {qos}
cleansession true
notifications false
"""


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    if not found:
        raise RuntimeError("mosquitto not found: install it (Debian: apt-get install mosquitto)")
    return found


class BridgePair:
    """Broker A on `port_a` bridged to broker B on `port_b`; `start()`, then `stop()`."""

    def __init__(self, run_dir: Path, port_a: int, port_b: int, qos: int) -> None:
        self.run_dir = run_dir
        self.port_a, self.port_b, self.qos = port_a, port_b, qos
        self.refs: dict[str, ProcRef] = {}

    def _start_one(self, name: str, port: int, extra: str, timeout: float) -> None:
        conf = self.run_dir / f"{name}.conf"
        conf.write_text(COMMON.format(port=port) + extra)
        log = self.run_dir / f"{name}.log"
        popen, ref = spawn([mosquitto_binary(), "-c", str(conf)], log, ("mosquitto", str(conf)))
        self.refs[name] = ref
        deadline = time.monotonic() + timeout
        while not port_open(port):
            if popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bridge broker {name} did not start on port {port}; "
                                   f"{log} ends with:\n{tail(log)}")
            time.sleep(0.05)

    def start(self, timeout: float = 10.0) -> None:
        """Start B, then A (whose bridge connects to B at once)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o755)
        self._start_one("b", self.port_b, "", timeout)
        self._start_one("a", self.port_a, BRIDGE.format(peer=self.port_b, qos=self.qos),
                        timeout)

    @property
    def pids(self) -> dict[str, int]:
        return {name: ref.pid for name, ref in self.refs.items()}

    def logs(self) -> list[Path]:
        return [self.run_dir / f"{name}.log" for name in ("a", "b")]

    def stop(self) -> None:
        stop(list(self.refs.values()))
