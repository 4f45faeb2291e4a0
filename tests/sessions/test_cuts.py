"""A moving session's cut mode, the sidecar's part (sidecar.sessions.cuts): where this node's
cut goes, the old node's own cut, and what the new node's live hold leaves out."""

from __future__ import annotations

import asyncio

from sidecar._proto import peer_pb2
from sidecar.sessions import wire
from sidecar.sessions.cuts import MoveCuts, OldCopyCuts


def _backlog(**kw) -> peer_pb2.SessionBacklog:
    cuts = OldCopyCuts(**kw) if kw else None
    frame = peer_pb2.Frame.FromString(wire.backlog_frame("dev", 3, [], last=True, cuts=cuts))
    return frame.session_backlog


def test_the_new_nodes_cut_goes_to_the_node_the_client_comes_from():
    cuts = MoveCuts()
    assert cuts.target("dev") is None   # not arriving here: nobody
    cuts.arriving["dev"] = "n1"
    assert cuts.target("dev") == "n1"
    assert cuts.release("dev") == {} and cuts.target("dev") is None


def test_the_old_nodes_own_cut_is_awaited_and_sent_nowhere():
    async def main():
        cuts = MoveCuts()
        cuts.arriving["dev"] = "n1"     # (an older arrival: the old node's drain wins)

        async def hold():
            assert cuts.target("dev") is None
            cuts.on_cut("dev", 41)
        got = await cuts.own_cut("dev", hold)
        return got, cuts.counters
    got, counters = asyncio.run(main())
    assert got == 41 and counters["own_cuts"] == 1


def test_the_last_frame_tells_the_live_hold_what_to_leave_out():
    cuts = MoveCuts()
    cuts.arriving["dev"] = "n1"
    cuts.on_last_backlog(_backlog(cut=("n1/5", 42), granted=(("00ff00ff00ff00ff", 7),)))
    assert cuts.release("dev") == {"granted": [["00ff00ff00ff00ff", 7]],
                                   "cuts": [["n1/5", 42]]}
    assert cuts.release("dev") == {}    # once
    cuts.on_last_backlog(_backlog())    # an older node's (or nothing to leave out)
    assert cuts.release("dev") == {}


def test_a_chain_hands_on_what_the_old_copy_before_it_had():
    """The client left this node before its old queue came (n1's, with n1's cut and
    identities): the live hold here was never released, so the drain onwards takes those
    (`upstream`) and its last frame carries them with its own, to the next node."""
    cuts = MoveCuts()
    cuts.on_last_backlog(_backlog(cut=("n1/5", 42), granted=(("00ff00ff00ff00ff", 7),),
                                  upstream=(("n0/2", 9),)))
    upstream = cuts.upstream("dev")
    assert upstream == OldCopyCuts(granted=(("00ff00ff00ff00ff", 7),),
                                   upstream=(("n1/5", 42), ("n0/2", 9)))
    assert cuts.upstream("dev") == upstream  # until the drain went (a failed one is retried)
    cuts.forget_upstream("dev")
    assert cuts.upstream("dev") == OldCopyCuts()
    onward = _backlog(cut=("n2/3", 11), granted=(("0a", 1),) + upstream.granted,
                      upstream=upstream.upstream)
    cuts.on_last_backlog(onward)
    assert cuts.release("dev") == {"granted": [["0a", 1], ["00ff00ff00ff00ff", 7]],
                                   "cuts": [["n2/3", 11], ["n1/5", 42], ["n0/2", 9]]}

