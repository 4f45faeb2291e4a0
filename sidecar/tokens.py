"""Cluster tokens (the peer token, the admin token): reading a token file, and refusing the
example tokens the compose file ships. The tokens themselves never go on the wire: calls carry
proofs of them (`sidecar.challenge`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["ALLOW_DEFAULT_TOKENS", "DEFAULT_TOKENS", "AuthError", "check_not_default",
           "read_token"]

DEFAULT_TOKENS = frozenset({"change-me", "change-me-too"})
"""The example tokens of compose/docker-compose.yml: public, so they protect nothing."""
ALLOW_DEFAULT_TOKENS = "MQFED_ALLOW_DEFAULT_TOKENS"
"""Set to 1 to start with an example token anyway (throw-away test clusters)."""


class AuthError(ValueError):
    """The token cannot be used; the message says which one and why."""


def read_token(path: str | Path, what: str = "admin token") -> str:
    """The token in a token file (surrounding whitespace stripped); AuthError if unusable."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise AuthError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not token:
        raise AuthError(f"the {what} file {path} is empty")
    return token


def configured_token(section: Mapping[str, str], what: str) -> str:
    """The token a config section sets by `token` or in its `token_file` ("" for none)."""
    if section["token"]:
        return section["token"]
    return read_token(section["token_file"], what) if section["token_file"] else ""


def check_not_default(token: str | None, what: str, env: Mapping[str, str]) -> None:
    """AuthError if `token` is one of the published example tokens, unless the environment
    allows them explicitly (`MQFED_ALLOW_DEFAULT_TOKENS=1`)."""
    if token in DEFAULT_TOKENS and env.get(ALLOW_DEFAULT_TOKENS, "") not in ("1", "true", "yes"):
        raise AuthError(
            f"the {what} is {token!r}, an example token published with mqfed: anyone could use"
            f" it. Set a random one (e.g. `openssl rand -hex 32`), or set"
            f" {ALLOW_DEFAULT_TOKENS}=1 to start anyway (throw-away test clusters only)")
