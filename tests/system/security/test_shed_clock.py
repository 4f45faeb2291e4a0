"""The overload-shed lease runs on a monotonic clock (issue 16): a step of the wall clock, back
or forward, neither prolongs nor ends it. Mosquitto runs with a tiny LD_PRELOAD shim that
shifts CLOCK_REALTIME by the number of seconds in a file the test writes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.system.plugin.helpers import SECRET, SIDECAR_ID, SIDECAR_USER, Client, FakeSidecar

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int clock_gettime(clockid_t id, struct timespec *ts)
{
	static int (*real)(clockid_t, struct timespec *);
	const char *path = getenv("MQFED_TEST_CLOCK_SHIFT");
	long shift = 0;
	FILE *f;
	int rc;

	if(real == NULL){
		real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	}
	rc = real(id, ts);
	if(rc == 0 && id == CLOCK_REALTIME && path && (f = fopen(path, "r")) != NULL){
		if(fscanf(f, "%ld", &shift) == 1) ts->tv_sec += shift;
		fclose(f);
	}
	return rc;
}
"""


def build_shim(folder: Path) -> Path:
    src, lib = folder / "clockshift.c", folder / "clockshift.so"
    src.write_text(SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"],
                   check=True, capture_output=True, timeout=60)
    lib.chmod(0o755)
    return lib


def test_a_wall_clock_step_neither_prolongs_nor_ends_a_lease(make_broker, clients,
                                                              readable_dir):
    shift = readable_dir / "shift"
    shift.write_text("0\n")
    shift.chmod(0o644)
    shim = build_shim(readable_dir)
    b = make_broker(wrapper=["env", f"LD_PRELOAD={shim}", f"MQFED_TEST_CLOCK_SHIFT={shift}"])
    sc = clients(FakeSidecar(b.sock)).start()
    fwd = clients(Client(SIDECAR_ID + ".fwd", sock=b.sock, username=SIDECAR_USER,
                         password=SECRET))
    fwd.connect()
    fwd.subscribe("t/#", 1)
    events_before = sc.unique_events()[-1]["t"]

    # back by an hour: a 1 s lease still ends after 1 s
    assert sc.call("pressure", unacked=0, taken=0, shed_ms=1000)["shedding"] is True
    shift.write_text("-3600\n")
    time.sleep(1.5)
    assert sc.call("stats")["shedding"] is False
    # the shim works: the plugin's wall-clock event timestamps moved back an hour
    assert sc.wait_events(lambda e: e["type"] == "heartbeat"
                          and e["t"] < events_before - 3_000_000, timeout=3)

    # forward by an hour: a 3 s lease does not end at once
    assert sc.call("pressure", unacked=0, taken=0, shed_ms=3000)["shedding"] is True
    shift.write_text("3600\n")
    time.sleep(0.5)
    assert sc.call("stats")["shedding"] is True
    assert sc.call("pressure", unacked=0, taken=0, shed_ms=0)["shedding"] is False
