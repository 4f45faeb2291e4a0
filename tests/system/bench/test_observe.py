"""The bench's CPU meter: named processes, and every other process under "others"."""

from __future__ import annotations

import subprocess
import sys
import time

from sidecar.bench.observe import CpuMeter

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n" \
       "print('done', flush=True)\ntime.sleep(30)\n"


def test_others_are_counted_per_process_and_named() -> None:
    busy = subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True)
    named = subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True)
    try:
        meter = CpuMeter({"named": named.pid})
        meter.start()  # the children are still starting: nearly all their burn is inside
        assert busy.stdout.readline().strip() == "done"
        assert named.stdout.readline().strip() == "done"
        wall = time.monotonic() - meter.started
        cpu = meter.stop()
        burned = 100 * 0.4 / wall  # % of one core each child used inside the window
        assert cpu["named"] >= 0.5 * burned, (cpu, burned)
        assert cpu["others"] >= 0.5 * burned, (cpu, burned)
        busiest = meter.busiest_others()
        assert busiest and busiest[0][1] == busy.pid, busiest
        assert named.pid not in [pid for _, pid, _ in busiest]  # named, so not an "other"
    finally:
        for proc in (busy, named):
            proc.kill()
            proc.wait()
