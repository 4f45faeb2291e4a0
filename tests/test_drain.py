"""The graceful-leave drain: who is disconnected, in which order, and when it is settled."""

from __future__ import annotations

import asyncio

from sidecar.drain import drain, settled
from sidecar.local.events import CommandFailed


class FakeLink:
    """Records commands; `gone` clients answer `not_connected` to a kick."""

    def __init__(self, gone: frozenset[str] = frozenset()) -> None:
        self.calls: list[tuple[str, str]] = []
        self.gone = gone

    async def request(self, cmd: str, timeout: float = 5.0, **fields):
        self.calls.append((cmd, fields["client"]))
        if cmd == "kick" and fields["client"] in self.gone:
            raise CommandFailed("plugin refused kick: not_connected", "not_connected")
        assert cmd != "kick" or fields["with_will"] is True
        assert cmd != "deny" or fields["mode"] == "retry"


class Routing:
    def __init__(self, unsettled: int, last_copy_at: float) -> None:
        self.unsettled = unsettled
        self.last_copy_at = last_copy_at


def test_settled_needs_nothing_pending_and_a_quiet_period():
    assert settled(0, 10.0, 10.5, quiet=0.3)
    assert not settled(1, 10.0, 10.5, quiet=0.3)
    assert not settled(0, 10.4, 10.5, quiet=0.3)


def test_each_client_is_denied_before_it_is_kicked_and_gone_ones_are_not_counted():
    link = FakeLink(gone=frozenset({"b"}))
    result = asyncio.run(drain(link, ["a", "b"], None))
    assert result.clients == 1 and result.settled
    for client in ("a", "b"):
        mine = [cmd for cmd, c in link.calls if c == client]
        assert mine == ["deny", "kick"]


def test_drain_waits_for_pending_messages_then_gives_up_at_the_timeout():
    routing = Routing(unsettled=2, last_copy_at=0.0)

    async def run():
        async def settle_later():
            await asyncio.sleep(0.1)
            routing.unsettled = 0
        task = asyncio.create_task(settle_later())
        result = await drain(FakeLink(), [], routing, timeout=3.0)
        await task
        return result

    result = asyncio.run(run())
    assert result.settled and result.seconds >= 0.3  # pending cleared, then a quiet period
    stuck = asyncio.run(drain(FakeLink(), [], Routing(1, 0.0), timeout=0.3))
    assert not stuck.settled and stuck.seconds >= 0.3
