"""`make mutants`: break the code on purpose, one mutation at a time, and check that the tests
named for it fail (issue 23). Not part of `make test`: it runs each mutation's tests once more.

Each mutation replaces one exact snippet of one source file (found exactly once, so a change
to the code that moves it is reported, not silently skipped), runs its tests with pytest, and
puts the file back byte for byte, also on Ctrl-C or a crash (and a file with uncommitted
changes is refused, so `git checkout -- FILE` is always a safe recovery). A mutation is
*caught* when pytest reports failed tests (exit 1); it *survived* when they pass; anything
else (no tests collected, an internal error) is an error. First the named tests run once
unmutated: a test that already fails would catch every mutation and prove nothing.

    python deploy/ci/mutants.py [--only NAME ...] [--no-baseline] [--list]

Exit status 0 only when every mutation was caught.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


FAULTS = "tests/system/routing/test_faults.py::"
MUTANTS = (
    # the five that survived the audit in issue 23, each caught by a real-process scenario
    Mutant("receive-side dedup bypassed", "sidecar/routing/service.py",
           "            if not first:\n", "            if False:\n",
           ("tests/system/routing/test_stream_cut.py",)),
    Mutant("retained merge made last-arrival-wins", "sidecar/retained/index.py",
           "entry.version > current.version", "entry.version != current.version",
           ("tests/system/retained/test_winner.py",)),
    Mutant("copy acked to Mosquitto before any peer holds it", "sidecar/routing/forwarder.py",
           "        if copy.qos == 0:\n            actions.append(AckLocal(copy.mid, 0))\n",
           "        if True:\n            actions.append(AckLocal(copy.mid, copy.qos))\n",
           (FAULTS + "test_origin_crash_while_the_receiver_is_frozen_loses_nothing_acknowledged",)),
    Mutant("etcd registration never renewed", "sidecar/membership/etcd.py",
           "                    await self._register(starting=False)\n"
           "                self._set_reachable(True)\n",
           "                    pass\n                self._set_reachable(True)\n",
           ("tests/system/membership/test_etcd.py::test_etcd_outage_keeps_view_and_reregisters",)),
    Mutant("no drain pacing", "sidecar/routing/pacing.py",
           '        """How many queued messages may go to `peer` now (call `spent` after'
           ' sending)."""\n',
           '        """How many queued messages may go to `peer` now (call `spent` after'
           ' sending)."""\n        return Budget(float("inf"))\n',
           (FAULTS + "test_backlog_beyond_max_queued_messages_drains_paced",)),
    # the ones the suite caught already
    Mutant("forwarded once per matching filter", "sidecar/routing/interest.py",
           "            if plain_min == min(u.sid for u in matching):\n", "            if True:\n",
           ("tests/routing/test_interest.py", "tests/system/routing/test_routing.py::"
            "test_overlapping_subscriptions_behave_like_one_broker")),
    Mutant("batches leave in reverse order", "sidecar/peering/outbound.py",
           "        return out\n\n    def on_acked", "        return out[::-1]\n\n    def on_acked",
           ("tests/peering/test_outbound.py",)),
    Mutant("wildcards match $ topics", "sidecar/topics.py",
           '    if topic.startswith("$") and filter[:1] in ("+", "#"):\n',
           "    if False:\n", ("tests/test_topics.py",)),
    Mutant("shed threshold doubled", "sidecar/local/pressure.py",
           "unacked >= self.shed_above", "unacked >= 2 * self.shed_above",
           ("tests/local/test_pressure.py",)),
    Mutant("audit counts delivered as lost", "pipeline/metrics.py",
           '(F.col("expected") & ~F.col("received")).alias("lost")',
           '(F.col("expected") & F.col("received")).alias("lost")',
           ("tests/system/pipeline/test_metrics.py",)),
    Mutant("a moved session's queue is not handed over", "sidecar/sessions/service.py",
           "        if not queued:\n            return True\n",
           "        if True:\n            return True\n",
           ("tests/system/sessions/test_sessions.py::"
            "test_a_session_resumes_on_another_node_with_what_it_missed",)),
    Mutant("a connect elsewhere does not take over", "sidecar/sessions/registry.py",
           "                out.append(Kick(record.client, with_will=not kept or record.fresh))\n",
           "                pass\n",
           ("tests/system/sessions/test_sessions.py::"
            "test_a_connect_anywhere_takes_over_the_older_connection",)),
    Mutant("nothing resent after a reconnect", "sidecar/peering/outbound.py",
           "            self._unsent.extendleft(reversed(self._sent.values()))\n",
           "            pass\n", ("tests/peering/test_outbound.py",)),
    Mutant("a catch-up holds nothing back", "sidecar/routing/catchup.py",
           "        requests = self.waiting.get(peer)\n", "        requests = None\n",
           ("tests/system/routing/test_catchup.py::test_a_stream_goes_on_in_order_from_the_suback",
            "tests/routing/test_catchup.py")),
)


class Interrupted(Exception):
    pass


def _raise(signum, frame) -> None:
    raise Interrupted(f"signal {signum}")


def pytest(tests: tuple[str, ...], timeout: float) -> tuple[int, str]:
    """Run `tests`; (exit code, last lines of the output). Past `timeout` pytest gets SIGINT
    (its fixtures stop what the tests started), then its process group SIGKILL."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                             "no:cacheprovider", *tests], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return -1, f"timed out after {timeout:.0f}s"
    except BaseException:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        raise
    return code, "\n".join(out.strip().splitlines()[-3:])


def clean_in_git(path: Path) -> bool:
    result = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(path)], cwd=REPO)
    return result.returncode == 0


def run_one(m: Mutant, timeout: float) -> tuple[str, str]:
    """Apply `m`, run its tests, restore the file; (verdict, detail)."""
    path = REPO / m.path
    original = path.read_bytes()
    text = original.decode()
    if text.count(m.old) != 1:
        return "error", f"snippet found {text.count(m.old)} times in {m.path}: update MUTANTS"
    try:
        path.write_text(text.replace(m.old, m.new))
        code, tail = pytest(m.tests, timeout)
    finally:
        path.write_bytes(original)
    if code == 1:
        return "caught", tail
    if code == 0:
        return "SURVIVED", tail
    return "error", f"pytest exit {code}: {tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run the mutations whose name contains NAME (repeatable)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unmutated run of the named tests")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds per pytest run (default 600)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or any(o in m.name for o in args.only)]
    if args.list or not chosen:
        for m in MUTANTS:
            print(f"{m.name:50} {m.path}  ->  {' '.join(m.tests)}")
        return 0 if args.list else 2
    dirty = sorted({m.path for m in chosen if not clean_in_git(REPO / m.path)})
    if dirty:
        print(f"uncommitted changes in {', '.join(dirty)}: commit or stash them first",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGHUP, _raise)
    if not args.no_baseline:
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        print(f"baseline: {len(tests)} test targets unmutated ...", flush=True)
        code, tail = pytest(tests, args.timeout * 2)
        if code != 0:
            print(f"baseline failed (pytest exit {code}); fix that first:\n{tail}")
            return 2
    results: list[tuple[Mutant, str, float]] = []
    try:
        for m in chosen:
            started = time.monotonic()
            verdict, detail = run_one(m, args.timeout)
            took = time.monotonic() - started
            results.append((m, verdict, took))
            last = detail.splitlines()[-1] if detail else ""
            print(f"{verdict:9} {m.name} ({took:.0f}s)\n          {last}", flush=True)
    except (KeyboardInterrupt, Interrupted):
        print("interrupted: every mutated file was restored", file=sys.stderr)
        return 130
    survivors = [m.name for m, verdict, _ in results if verdict != "caught"]
    print(f"\n{len(results) - len(survivors)} of {len(results)} mutations caught; "
          f"{len(survivors)} survivors or errors" + (f": {', '.join(survivors)}"
                                                     if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
