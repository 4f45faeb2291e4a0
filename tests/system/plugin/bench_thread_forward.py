"""Slice 3 probe (issue 25): a hop made by a thread of the plugin against a Mosquitto bridge
(not part of the default test run; the probe is not part of the product).

    make -C deploy/mosquitto-plugin probes
    .venv/bin/python -m tests.system.plugin.bench_thread_forward --rate 2000 --seconds 10
    .venv/bin/python -m tests.system.plugin.bench_thread_forward --messages 50000
    .venv/bin/python -m tests.system.plugin.bench_thread_forward --valgrind --rate 500 --seconds 3
    .venv/bin/python -m tests.system.plugin.bench_thread_forward --cases acl --rate 2000 \
        --seconds 10

Two pairs of stock Mosquitto brokers, A → B: one joined by a plain bridge (`bench/#` out at
the bench's QoS), one by the probe plugin on A (`probes/thread_forward.c`: the MESSAGE
callback copies, the TICK wakes the plugin's thread, which publishes to B). Cases, with
`mqfed bench`'s load generator and subscriber (`sidecar.bench.run.run_case`):
a = publisher and subscriber on the bridge's A (the same-node baseline), c = the bridge,
p = the probe with its thread, t = the probe writing from Mosquitto's own thread at each TICK
(no thread, no wake; `plugin_opt_probe_mode tick`), l = the product's links (issue 25 slice
3, plugin half: linkout.c and linkin.c, two brokers with the mqfed plugin, A capturing for a
`.fwd` subscribed to `bench/#` and linked to B; no sidecar process, a client sets the links
and stays idle); in the order given by `--cases`, every run printed. With `--valgrind`, the
probe's broker A runs under valgrind and its report is checked. Every process is stopped by
PID.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from sidecar.bench import run as bench_run
from sidecar.bench.bridge import COMMON, BridgePair, mosquitto_binary
from sidecar.devcluster.net import port_open
from sidecar.devcluster.procs import ProcRef, spawn, stop, tail
from tests.system.plugin.helpers import (
    PLUGIN_SO,
    SECRET,
    SIDECAR_ID,
    SIDECAR_USER,
    FakeSidecar,
    RawClient,
    build_plugin,
    mosquitto_dir,
)

PROBE = Path(__file__).resolve().parents[3] / "deploy/mosquitto-plugin/build/probes/" \
    "thread_forward.so"
PLUGIN_LINES = """\
plugin {probe}
plugin_opt_probe_filter bench/#
plugin_opt_probe_host 127.0.0.1
plugin_opt_probe_port {peer}
plugin_opt_probe_mode {mode}
"""
TITLES = {"a": "same broker (the bridge's A)", "c": "Mosquitto bridge (A -> B)",
          "p": "probe: plugin thread (A -> B)", "t": "probe: sent at TICK (A -> B)",
          "l": "mqfed links, plugin half (A -> B)"}
LINK_SECRET = "bench-link-secret-0123456789"
LINK_LINES = """\
per_listener_settings false
plugin {plugin}
plugin_opt_sidecar_secret {secret}
plugin_opt_capture_socket {capture}
plugin_opt_link_secret {link_secret}
plugin_opt_max_queued_messages 1000
"""
VALGRIND = ["valgrind", "--error-exitcode=99", "--leak-check=full",
            "--errors-for-leak-kinds=definite", "--log-file={log}"]


def start_broker(run_dir: Path, name: str, port: int, conf_text: str, wrap: list[str],
                 kind: str) -> ProcRef:
    """Write `<name>.conf` in `run_dir` and start Mosquitto on it (under `wrap`, e.g.
    valgrind), logging to `<name>.log`; returns once it listens on `port` (stopped again if it
    does not)."""
    conf = run_dir / f"{name}.conf"
    conf.write_text(conf_text)
    log = run_dir / f"{name}.log"
    popen, ref = spawn([*wrap, mosquitto_binary(), "-c", str(conf)], log, (str(conf),))
    deadline = time.monotonic() + (60 if wrap else 10)
    while not port_open(port):
        if popen.poll() is not None or time.monotonic() > deadline:
            stop([ref], timeout=10)   # by its PID, as the caller would have
            raise RuntimeError(f"{kind} broker {name} did not start; {log}:\n{tail(log)}")
        time.sleep(0.05)
    return ref


class ProbePair:
    """Broker B, then broker A with the probe forwarding to B; `start()`, then `stop()`."""

    def __init__(self, run_dir: Path, port_a: int, port_b: int, valgrind: bool,
                 mode: str) -> None:
        self.run_dir, self.port_a, self.port_b, self.valgrind = run_dir, port_a, port_b, valgrind
        self.mode = mode
        self.refs: dict[str, ProcRef] = {}

    def _start(self, name: str, port: int, extra: str, wrap: list[str]) -> None:
        self.refs[name] = start_broker(self.run_dir, name, port,
                                       COMMON.format(port=port) + extra, wrap, "probe")

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o755)
        self._start("b", self.port_b, "", [])
        wrap = [w.format(log=self.run_dir / "valgrind.log") for w in VALGRIND] \
            if self.valgrind else []
        self._start("a", self.port_a, PLUGIN_LINES.format(probe=PROBE, peer=self.port_b,
                                                             mode=self.mode), wrap)

    @property
    def pids(self) -> dict[str, int]:
        return {f"probe {name}": ref.pid for name, ref in self.refs.items()}

    def logs(self) -> list[Path]:
        return [self.run_dir / f"{name}.log" for name in ("a", "b")]

    def stop(self) -> None:
        stop(list(self.refs.values()), timeout=60)

    def valgrind_errors(self) -> int:
        text = (self.run_dir / "valgrind.log").read_text()
        found = re.search(r"ERROR SUMMARY: (\d+) errors", text)
        if found is None:
            raise RuntimeError(f"no valgrind summary in {self.run_dir / 'valgrind.log'}")
        return int(found.group(1))


class LinkPair:
    """Brokers A and B with the mqfed plugin; A's `.fwd` subscribes to `bench/#` (so capture
    sees the bench's messages) and A links to B for `bench/#` (`links`, `link_filters`)."""

    def __init__(self, port_a: int, port_b: int) -> None:
        self.port_a, self.port_b = port_a, port_b
        self.run_dir = Path()
        self.refs: dict[str, ProcRef] = {}
        self.conns: list = []

    def _start(self, name: str, port: int) -> None:
        text = (LINK_LINES.format(plugin=PLUGIN_SO, secret=SECRET,
                                  capture=self.run_dir / f"{name}-capture.sock",
                                  link_secret=LINK_SECRET)
                + COMMON.format(port=port) + f"listener 0 {self.run_dir / f'{name}.sock'}\n")
        self.refs[name] = start_broker(self.run_dir, name, port, text, [], "link")

    def start(self) -> None:
        build_plugin()
        self.run_dir = mosquitto_dir()   # one Mosquitto's user reaches (its unix sockets)
        self._start("b", self.port_b)
        self._start("a", self.port_a)
        sc = FakeSidecar(str(self.run_dir / "a.sock")).start()
        fwd = RawClient(SIDECAR_ID + ".fwd", sock=str(self.run_dir / "a.sock"),
                        username=SIDECAR_USER, password=SECRET)
        fwd.connect()
        self.conns += [sc, fwd]
        if fwd.subscribe("bench/#", 1, no_local=True) != [1]:
            raise RuntimeError("the forwarding subscription was refused")
        link = {"peer": "b", "host": "127.0.0.1", "port": self.port_b,
                "username": "mqfed-link", "password": LINK_SECRET}
        for cmd, fields in (("links", {"node": "a", "links": [link]}),
                            ("link_filters", {"peer": "b", "add": ["bench/#"]})):
            reply = sc.call(cmd, **fields)
            if reply.get("ok") is not True:
                raise RuntimeError(f"{cmd}: {reply}")
        deadline = time.monotonic() + 10
        while sc.call("stats")["links"]["up"] != 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the link did not come up; {self.run_dir / 'a.log'}")
            time.sleep(0.05)

    def stats(self) -> dict:
        return self.conns[0].call("stats")["links"]

    @property
    def pids(self) -> dict[str, int]:
        return {f"link {name}": ref.pid for name, ref in self.refs.items()}

    def logs(self) -> list[Path]:
        return [self.run_dir / f"{name}.log" for name in ("a", "b")]

    def stop(self) -> None:
        for c in self.conns:
            c.close()
        stop(list(self.refs.values()), timeout=60)
        if self.refs:
            print(f"links pair logs (kept): {self.run_dir}")


def _brokers_us(case: dict) -> float:
    pct = sum(v for k, v in case["cpu_percent"].items()
              if k.startswith(("bridge ", "probe ", "link ")))
    return pct * 1e4 / case["throughput"] if case.get("throughput") else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=0.0, help="msgs/s in all (0: flat out)")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--cases", default="acpt")
    parser.add_argument("--base-port", type=int, default=31300)
    parser.add_argument("--valgrind", action="store_true")
    args = parser.parse_args()
    if not PROBE.exists() and set(args.cases) & {"p", "t"}:
        raise SystemExit(f"{PROBE} is missing: make -C deploy/mosquitto-plugin probes")
    messages = args.messages if args.messages or args.seconds else 20000
    run_dir = Path(tempfile.mkdtemp(prefix="mqfed-probe-", dir="/tmp"))
    opts = bench_run.BenchOptions(run_dir=run_dir, base_port=args.base_port, rate=args.rate,
                                  messages=messages, seconds=args.seconds)
    bridge = BridgePair(run_dir / "bridge", args.base_port, args.base_port + 1, opts.qos)
    probes = {"p": ProbePair(run_dir / "probe", args.base_port + 2, args.base_port + 3,
                             args.valgrind, "thread"),
              "t": ProbePair(run_dir / "tick", args.base_port + 4, args.base_port + 5,
                             args.valgrind, "tick")}
    links = LinkPair(args.base_port + 6, args.base_port + 7)
    rows = []
    try:
        bridge.start()
        for key, probe in probes.items():
            if key in args.cases:
                probe.start()
        if "l" in args.cases:
            links.start()
        for key in args.cases:
            if key == "l":
                pair = links
                target = bench_run.Target(key, links.port_a, links.port_b)
                pids = links.pids
            elif key in probes:
                pair = probes[key]
                target = bench_run.Target(key, pair.port_a, pair.port_b)
                pids = pair.pids
            else:
                pair = bridge
                target = bench_run.Target(key, bridge.port_a,
                                          bridge.port_a if key == "a" else bridge.port_b)
                pids = {f"bridge {k}": v for k, v in bridge.pids.items()}
            bench_run.TITLES[key] = TITLES[key]   # run_case names its case from there
            rows.append(bench_run.run_case(opts, target, pids, pair.logs()))
        if "l" in args.cases:
            print(f"links (A): {links.stats()}")
    finally:
        bridge.stop()
        links.stop()
        for probe in probes.values():
            probe.stop()
    print(f"{messages or '-'} messages, rate {args.rate or 'flat out'}, QoS 1, 100 B, "
          f"1 publisher (run dir {run_dir})")
    print("case                                 sent   recv  lost  dup   msgs/s  p50 ms  "
          "p99 ms  brokers us/msg")
    base = next((r for r in rows if r["case"] == "a"), None)
    for r in rows:
        print(f"{r['case']}  {r['title']:<32} {r['sent']:>6} {r['received']:>6} {r['lost']:>5}"
              f" {r['duplicates']:>4} {r['throughput']:>8.0f} {r['p50_ms']:>7.3f}"
              f" {r['p99_ms']:>7.3f}  {_brokers_us(r):>8.1f}")
        if base is not None and r is not base:
            print(f"   hop ({r['case']} - a): p50 +{r['p50_ms'] - base['p50_ms']:.3f} ms,"
                  f" p99 +{r['p99_ms'] - base['p99_ms']:.3f} ms; cpu {r['cpu_percent']}")
    if args.valgrind:
        errors = {k: p.valgrind_errors() for k, p in probes.items() if k in args.cases}
        print(f"valgrind (probe brokers A): {errors} errors")
        if any(errors.values()):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
