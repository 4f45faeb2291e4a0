"""Challenge-response proof of a shared token (sans-IO: clock and randomness are passed in).

A cluster token (the peer token, the admin token) is never sent. Whoever holds it proves it:

1. the caller asks the callee for a server nonce (`Verifier.challenge`): stateless (a MAC
   under a per-process secret), valid for `ttl` seconds, accepted once;
2. the caller names what it believes (`Claim`: its own id, the callee's id, the address it
   dialled, its own nonce, the server nonce) and sends `Proof.prove(claim)`, an HMAC over
   the claim, with its call;
3. the callee checks the claim before it reads any message (`Verifier.verify`): the server
   nonce is its own, fresh and unused; the callee and the address are its own; the HMAC is
   right. It answers with `Proof.answer(claim)` (another label, so a proof cannot be
   reflected), which the caller checks (`Proof.check_answer`) before it sends anything else.

The HMAC key is PBKDF2-SHA256 of the token (`derive_key`): a recorded proof lets nobody
compute another one, and each guess at the token from it costs a PBKDF2. Binding the dialled
address defeats a relay: a node made to dial a forged address (a record written to etcd)
produces a proof naming that address, which the real callee, whose addresses differ, refuses.
An empty callee or address is "unbound" (`mqfed ctl`, which only knows the address it was
given); a verifier may accept those (`accept_unbound`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["ITERATIONS", "Claim", "Proof", "Verifier", "derive_key"]

VERSION = "v1"
ITERATIONS = 100_000
NONCE_BYTES = 16
MAX_FIELD = 256
"""Longest claim field accepted (ids, addresses, nonces): longer ones are refused unread."""
_TAG = 16


@dataclass(frozen=True)
class Claim:
    """What a caller states about one call; the proof covers every field."""

    caller: str  # the caller's node id ("" for `mqfed ctl`)
    callee: str  # the node id the caller means to reach ("" when it does not know it)
    address: str  # the address it dialled ("" when unbound)
    client_nonce: str
    server_nonce: str

    def fields(self) -> tuple[str, ...]:
        return (self.caller, self.callee, self.address, self.client_nonce, self.server_nonce)


@lru_cache(maxsize=16)
def derive_key(token: str, purpose: str) -> bytes:
    """The HMAC key of `token` for `purpose` ("peer", "admin"); slow on purpose."""
    salt = f"mqfed-auth-{VERSION}:{purpose}".encode()
    return hashlib.pbkdf2_hmac("sha256", token.encode(), salt, ITERATIONS)


def _encode(label: str, fields: Iterable[str]) -> bytes:
    out = bytearray()
    for part in (VERSION, label, *fields):
        data = part.encode()
        out += len(data).to_bytes(4, "big") + data
    return bytes(out)


class Proof:
    """Proofs under one token and purpose."""

    def __init__(self, token: str, purpose: str) -> None:
        if not token:
            raise ValueError("a proof needs a token")
        self.purpose = purpose
        self._key = derive_key(token, purpose)

    def _mac(self, label: str, claim: Claim) -> str:
        return hmac.new(self._key, _encode(label, claim.fields()), hashlib.sha256).hexdigest()

    def prove(self, claim: Claim) -> str:
        """The caller's proof that it holds the token."""
        return self._mac("call", claim)

    def answer(self, claim: Claim) -> str:
        """The callee's proof, sent back once it has verified the caller's."""
        return self._mac("answer", claim)

    def check_answer(self, claim: Claim, proof: str) -> bool:
        return hmac.compare_digest(proof.encode(), self.answer(claim).encode())

    def check_call(self, claim: Claim, proof: str) -> bool:
        return hmac.compare_digest(proof.encode(), self.prove(claim).encode())


class Verifier:
    """The callee's side: issues server nonces and verifies claims (see the module docstring).

    `me`: this node's id; `addresses`: the addresses callers may have dialled to reach it
    (None: any, for membership that no outsider can write, such as a static peer list);
    `secret`: random bytes of this process (server nonces of another process are refused).
    """

    def __init__(self, proof: Proof, me: str, addresses: frozenset[str] | None, secret: bytes,
                 *, ttl: float = 10.0, accept_unbound: bool = False) -> None:
        if len(secret) < 16:
            raise ValueError("the nonce secret needs at least 16 random bytes")
        self.proof = proof
        self.me = me
        self.addresses = addresses
        self.ttl = ttl
        self.accept_unbound = accept_unbound
        self._secret = secret
        self._used: dict[str, float] = {}  # server nonce -> when it expires

    def challenge(self, now: float, rand: bytes) -> str:
        """A new server nonce issued at `now` (seconds, monotonic) from random `rand`."""
        if len(rand) != NONCE_BYTES:
            raise ValueError(f"expected {NONCE_BYTES} random bytes")
        body = int(now * 1000).to_bytes(8, "big") + rand
        return (body + self._tag(body)).hex()

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body, hashlib.sha256).digest()[:_TAG]

    def verify(self, claim: Claim, proof: str, now: float) -> str | None:
        """None if the caller proved the token for this claim (the server nonce is then used
        up), else why not (for the log and the caller: never says what the token is)."""
        self._forget(now)
        if any(len(f) > MAX_FIELD for f in (*claim.fields(), proof)):
            return "a field of the proof is too long"
        issued = self._issued(claim.server_nonce)
        if issued is None:
            return "the server nonce was not issued by this process (did it restart?)"
        if now - issued > self.ttl or issued > now + 1.0:
            return f"the server nonce expired (valid {self.ttl:g}s)"
        if claim.server_nonce in self._used:
            return "the server nonce was already used (a replayed proof)"
        if not claim.client_nonce:
            return "no client nonce"
        unbound = self.accept_unbound and not claim.callee and not claim.address
        if not unbound:
            if claim.callee != self.me:
                return (f"the caller meant to reach node {claim.callee!r}, this is {self.me!r}"
                        " (a stale or forged membership record)")
            if self.addresses is not None and claim.address not in self.addresses:
                return (f"the caller dialled {claim.address!r}, which is not this node's"
                        f" address ({', '.join(sorted(self.addresses))}): a forged or"
                        " stale membership record, or a relay")
        if not self.proof.check_call(claim, proof):
            return "the proof does not match this node's token (a different token?)"
        self._used[claim.server_nonce] = issued + self.ttl
        return None

    def _issued(self, nonce: str) -> float | None:
        try:
            raw = bytes.fromhex(nonce)
        except ValueError:
            return None
        if len(raw) != 8 + NONCE_BYTES + _TAG:
            return None
        body, tag = raw[:-_TAG], raw[-_TAG:]
        if not hmac.compare_digest(tag, self._tag(body)):
            return None
        return int.from_bytes(body[:8], "big") / 1000

    def _forget(self, now: float) -> None:
        if self._used:
            for nonce in [n for n, until in self._used.items() if until < now]:
                del self._used[nonce]
