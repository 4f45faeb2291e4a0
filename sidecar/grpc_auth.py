"""Challenge-response authentication on gRPC calls (adapter over `sidecar.challenge`).

Used by the peer streams and the admin API alike:

- `Authenticator` (callee): answers Challenge calls with a server nonce and checks the proof in
  a call's metadata (`check`) before any request message is read; its `gate` caps the calls
  not yet authenticated (a flood of them is refused with RESOURCE_EXHAUSTED, unread).
- `Prover` (caller): fetches a nonce (`claim`), puts the proof into the call's metadata
  (`metadata`) and checks the callee's answer in the reply's initial metadata (`answered`).

Handlers that must not read a request before authenticating it are registered as
request-streaming ones (gRPC reads a unary request in full, up to the server's message
limit, before any handler or interceptor code can refuse it); a unary caller cannot tell.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from sidecar.challenge import NONCE_BYTES, Claim, Proof, Verifier

__all__ = ["ANSWER", "AuthFailure", "Authenticator", "Gate", "Prover", "answer_of",
           "claim_of", "refusal_of"]

PREFIX = "mqfed-auth-"
_KEYS = {"caller": "caller", "callee": "callee", "address": "address",
         "client_nonce": "cnonce", "server_nonce": "snonce"}
PROOF = PREFIX + "proof"
ANSWER = PREFIX + "answer"
UNAUTHENTICATED_LIMIT = 32
"""Calls not yet authenticated, at once, per server (more are refused unread)."""

_REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION,
             grpc.StatusCode.PERMISSION_DENIED)
Metadata = Iterable[tuple[str, str | bytes]]


class AuthFailure(Exception):
    """The other side did not prove the token; `by_peer`: it refused us (else we refused it)."""

    def __init__(self, message: str, by_peer: bool, code: str = "UNAUTHENTICATED") -> None:
        super().__init__(message)
        self.by_peer = by_peer
        self.code = code


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def claim_of(metadata: Metadata) -> tuple[Claim, str] | None:
    """The claim and proof in call metadata; None if the caller sent none."""
    found = {k.lower(): _text(v) for k, v in metadata if k.lower().startswith(PREFIX)}
    if PROOF not in found:
        return None
    fields = {name: found.get(PREFIX + key, "") for name, key in _KEYS.items()}
    return Claim(**fields), found[PROOF]


def answer_of(metadata: Metadata | None) -> str:
    """The callee's answer proof in a reply's initial metadata ("" if none)."""
    for key, value in metadata or ():
        if key.lower() == ANSWER:
            return _text(value)
    return ""


def refusal_of(metadata: Metadata) -> bool:
    """Whether an older caller presented a bearer token (it sends the token itself)."""
    return any(k.lower() == "authorization" for k, _ in metadata)


class Gate:
    """Counts calls in progress that are not authenticated yet; refuses past `limit`."""

    def __init__(self, limit: int = UNAUTHENTICATED_LIMIT) -> None:
        self.limit = limit
        self.inside = 0
        self.refused = 0

    def enter(self) -> bool:
        if self.inside >= self.limit:
            self.refused += 1
            return False
        self.inside += 1
        return True

    def leave(self) -> None:
        self.inside -= 1


@dataclass
class Checked:
    """A call that proved the token: send `answer` back as initial metadata."""

    claim: Claim
    answer: tuple[tuple[str, str], ...]


class Authenticator:
    """The callee's side for one server (see the module docstring)."""

    def __init__(self, token: str, purpose: str, me: str, addresses: frozenset[str] | None,
                 *, accept_unbound: bool = False, ttl: float = 10.0,
                 clock: Callable[[], float] = time.monotonic,
                 randomness: Callable[[int], bytes] = os.urandom) -> None:
        self.proof = Proof(token, purpose)
        self.verifier = Verifier(self.proof, me, addresses, randomness(32), ttl=ttl,
                                 accept_unbound=accept_unbound)
        self.gate = Gate()
        self._clock = clock
        self._randomness = randomness
        self.counters = {"challenges": 0, "accepted": 0, "refused": 0}

    def challenge(self) -> str:
        self.counters["challenges"] += 1
        return self.verifier.challenge(self._clock(), self._randomness(NONCE_BYTES))

    def check(self, metadata: Metadata) -> Checked | str | None:
        """Checked if the call proved the token; the reason if it tried and failed; None if
        it carried no proof at all."""
        found = claim_of(metadata)
        if found is None:
            self.counters["refused"] += 1
            return None
        claim, proof = found
        reason = self.verifier.verify(claim, proof, self._clock())
        if reason is not None:
            self.counters["refused"] += 1
            return reason
        self.counters["accepted"] += 1
        return Checked(claim, ((ANSWER, self.proof.answer(claim)),))


class Prover:
    """The caller's side under one token (see the module docstring)."""

    def __init__(self, token: str, purpose: str, me: str = "",
                 randomness: Callable[[int], bytes] = os.urandom) -> None:
        self.proof = Proof(token, purpose)
        self.me = me
        self._randomness = randomness

    async def claim(self, channel: grpc.aio.Channel, challenge_path: str, callee: str,
                    address: str, timeout: float, reply_type: Any) -> Claim:
        """Ask the callee for a server nonce; the claim for the next call. Raises
        AuthFailure when the callee refuses (it has no token) or has no Challenge method
        (an older version), grpc.aio.AioRpcError when it cannot be reached."""
        rpc = channel.unary_unary(challenge_path, request_serializer=None,
                                  response_deserializer=reply_type.FromString)
        try:
            reply = await rpc(b"", timeout=timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise AuthFailure(
                    f"{address} has no challenge-response authentication (an older mqfed,"
                    " peer protocol before 1.2): the token is not sent to it; upgrade that"
                    " node", by_peer=False) from None
            if exc.code() in _REFUSALS:
                raise AuthFailure(exc.details() or exc.code().name, by_peer=True) from None
            raise
        return Claim(self.me, callee, address, self._randomness(NONCE_BYTES).hex(),
                     reply.nonce)

    def metadata(self, claim: Claim) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying `claim` and its proof (never the token)."""
        out = [(PREFIX + key, getattr(claim, name)) for name, key in _KEYS.items()]
        return (*out, (PROOF, self.proof.prove(claim)))

    def answered(self, claim: Claim, initial_metadata: Metadata | None) -> bool:
        """Whether the callee proved the token in its reply's initial metadata."""
        answer = answer_of(initial_metadata)
        return bool(answer) and self.proof.check_answer(claim, answer)
