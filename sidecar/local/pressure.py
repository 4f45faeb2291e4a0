"""When to push back on publishers: the sidecar's half of overload shedding (sans-IO).

Mosquitto acknowledges a publisher on receipt and then owes the forwarding client a copy; past
Receive Maximum + `max_queued_messages` unacknowledged copies it discards the rest for good. So
while the cluster cannot keep up, the plugin refuses the QoS > 0 publishes peers want: it
disconnects their publisher before storing or acknowledging the message
(deploy/mosquitto-plugin/src/shed.c). The plugin sheds while

- a lease from the sidecar runs: this core grants one once the forwarding client holds
  `shed_above` unacknowledged copies, renews it while they stay above `resume_below`, and ends
  it below; a lease the sidecar stops renewing (it died) runs out by itself; or
- its own estimate of the copies Mosquitto holds for the forwarding client reaches
  `fwd_backlog_max`: copies routed to it (which the plugin counts) minus the copies the
  sidecar took (the running count in each report), plus the unacknowledged ones. Reports go
  out at least every `report_every` seconds, every `report_busy` seconds while copies flow;
  without them every routed copy counts.
"""

from __future__ import annotations

from dataclasses import dataclass

REPORT_EVERY = 0.5
"""Seconds between reports to the plugin (each brings its backlog estimate up to date)."""
REPORT_BUSY = 0.05
"""Seconds between reports while copies flow: between reports the plugin counts every copy
routed to the forwarding client as still held, so at a full-speed 14,000 copies/s a 0.5 s
gap alone would reach the default backlog limit of 5,000 and shed publishers needlessly."""
LEASE = 5.0
"""Seconds a shedding lease lasts unless renewed."""


@dataclass(frozen=True)
class Report:
    """One `pressure` command for the plugin."""

    unacked: int
    taken: int  # copies taken from Mosquitto since the sidecar started
    shed_ms: int  # 0 ends shedding
    changed: bool  # shedding started or stopped with this report


def shed_threshold(receive_maximum: int, configured: int = 0) -> int:
    """Unacknowledged copies at which shedding starts: `configured`, or a quarter of the
    forwarding client's Receive Maximum. Well below it, because copies Mosquitto has sent
    but the sidecar has not read yet are invisible here."""
    return configured if configured > 0 else max(2, receive_maximum // 4)


class Backpressure:
    """Hysteresis over the forwarding client's unacknowledged copies, and the report cadence."""

    def __init__(self, shed_above: int, resume_below: int | None = None,
                 report_every: float = REPORT_EVERY, lease: float = LEASE,
                 report_busy: float = REPORT_BUSY) -> None:
        if resume_below is None:
            resume_below = shed_above // 2
        if not 0 <= resume_below < shed_above:
            raise ValueError(f"need 0 <= resume_below ({resume_below}) < shed_above "
                             f"({shed_above})")
        self.shed_above = shed_above
        self.resume_below = resume_below
        self.report_every = report_every
        self.report_busy = report_busy
        self.lease = lease
        self.shedding = False
        self.episodes = 0  # times shedding started
        self.plugin_shedding = False
        self.plugin_backlog = 0
        self._plugin_seen = 0  # the plugin's own count (restarts with Mosquitto)
        self._plugin_base = 0
        self._last_report: float | None = None
        self._last_taken = 0

    def on_tick(self, unacked: int, taken: int, now: float) -> Report | None:
        """The report to send now, if any."""
        changed = False
        if not self.shedding and unacked >= self.shed_above:
            self.shedding, changed = True, True
            self.episodes += 1
        elif self.shedding and unacked < self.resume_below:
            self.shedding, changed = False, True
        since = None if self._last_report is None else now - self._last_report
        due = since is None or since >= self.report_every or (
            taken != self._last_taken and since >= self.report_busy)
        if not (changed or due):
            return None
        self._last_report, self._last_taken = now, taken
        return Report(unacked, taken, round(self.lease * 1000) if self.shedding else 0, changed)

    def on_reply(self, shedding: bool, shed_total: int, backlog: int = 0) -> None:
        """What the plugin answered: whether it sheds (for any reason), how many so far, and
        its estimate of the copies Mosquitto holds for the forwarding client."""
        self.plugin_shedding = shedding
        self.plugin_backlog = backlog
        if shed_total < self._plugin_seen:  # Mosquitto restarted: its count did too
            self._plugin_base += self._plugin_seen
        self._plugin_seen = shed_total

    @property
    def publishers_shed(self) -> int:
        """Publishers the plugin disconnected, over Mosquitto restarts."""
        return self._plugin_base + self._plugin_seen

    def status(self) -> dict[str, int | bool]:
        return {"shedding": self.shedding, "plugin_shedding": self.plugin_shedding,
                "episodes": self.episodes, "publishers_shed": self.publishers_shed,
                "plugin_backlog": self.plugin_backlog,
                "shed_above": self.shed_above, "resume_below": self.resume_below}
