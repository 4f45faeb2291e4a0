"""Challenge-response proofs of a shared token (sans-IO): what a verifier accepts and refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.challenge import Claim, Proof, Verifier, derive_key

SECRET = bytes(range(32))
RAND = bytes(16)


def verifier(token: str = "s3cret", **kw) -> Verifier:
    options = {"me": "n2", "addresses": frozenset({"10.0.0.2:7001"}), "secret": SECRET, **kw}
    return Verifier(Proof(token, "peer"), options.pop("me"), options.pop("addresses"),
                    options.pop("secret"), **options)


def claim_for(v: Verifier, now: float = 100.0, **fields) -> Claim:
    base = Claim("n1", "n2", "10.0.0.2:7001", "c" * 32, v.challenge(now, RAND))
    return replace(base, **fields)


def test_a_holder_of_the_token_is_accepted_once_and_answered():
    v = verifier()
    claim = claim_for(v)
    caller = Proof("s3cret", "peer")
    proof = caller.prove(claim)
    assert "s3cret" not in proof and len(proof) == 64
    assert v.verify(claim, proof, 101.0) is None
    assert caller.check_answer(claim, v.proof.answer(claim))
    assert "already used" in v.verify(claim, proof, 101.5)  # a replay of the same proof


def test_another_token_neither_proves_nor_answers():
    v = verifier()
    claim = claim_for(v)
    other = Proof("guess", "peer")
    assert "does not match" in v.verify(claim, other.prove(claim), 101.0)
    assert not other.check_answer(claim, v.proof.answer(claim))
    # a proof is never accepted as an answer (no reflection), nor across purposes
    assert not v.proof.check_answer(claim, v.proof.prove(claim))
    assert derive_key("s3cret", "peer") != derive_key("s3cret", "admin")


def test_a_proof_made_for_a_forged_address_or_node_is_refused_by_the_real_node():
    v = verifier()
    caller = Proof("s3cret", "peer")
    forged = claim_for(v, address="10.6.6.6:7001")  # the address a forged record named
    assert "not this node's address" in v.verify(forged, caller.prove(forged), 101.0)
    other = claim_for(v, callee="evil")
    assert "meant to reach node 'evil'" in v.verify(other, caller.prove(other), 101.0)
    unbound = claim_for(v, callee="", address="")  # not accepted unless asked for
    assert v.verify(unbound, caller.prove(unbound), 101.0) is not None
    lenient = verifier(accept_unbound=True)
    unbound = claim_for(lenient, callee="", address="")
    assert lenient.verify(unbound, caller.prove(unbound), 101.0) is None
    anywhere = verifier(addresses=None)  # a static peer list: any address
    claim = claim_for(anywhere, address="node2:7001")
    assert anywhere.verify(claim, caller.prove(claim), 101.0) is None


@pytest.mark.parametrize("nonce, why", [
    ("zz", "not issued"),
    ("00" * 40, "not issued"),
])
def test_server_nonces_not_issued_here_are_refused(nonce: str, why: str):
    v = verifier()
    claim = replace(claim_for(v), server_nonce=nonce)
    assert why in v.verify(claim, Proof("s3cret", "peer").prove(claim), 101.0)


def test_server_nonces_expire_and_belong_to_one_process():
    v = verifier(ttl=10.0)
    caller = Proof("s3cret", "peer")
    claim = claim_for(v, now=100.0)
    assert "expired" in v.verify(claim, caller.prove(claim), 111.0)
    restarted = verifier(secret=bytes(32))  # another process: another secret
    claim = claim_for(v)
    assert "not issued" in restarted.verify(claim, caller.prove(claim), 101.0)
    long = claim_for(v, caller="x" * 300)
    assert "too long" in v.verify(long, caller.prove(long), 101.0)
    assert "no client nonce" in v.verify(claim_for(v, client_nonce=""), "p", 101.0)
