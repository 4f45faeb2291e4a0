"""Admin authentication: a shared bearer token (sans-IO checks; reading the token file aside).

Every admin call carries `authorization: Bearer <token>` metadata. A node accepts it when the
token matches its own (`admin.token` or `admin.token_file`), or when it runs in the loopback-only
development mode (`admin.dev_mode`, refused at config load on any other listener). Nodes use
their own token when they ask each other, so a cluster shares one admin token.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AuthError", "AuthPolicy", "bearer_metadata", "read_token"]

HEADER = "authorization"
SCHEME = "Bearer "


class AuthError(ValueError):
    """The token cannot be read; the message says which file and why."""


def read_token(path: str | Path) -> str:
    """The token in a token file (surrounding whitespace stripped); AuthError if unusable."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise AuthError(f"cannot read the admin token file {path}: {exc.strerror}") from None
    if not token:
        raise AuthError(f"the admin token file {path} is empty")
    return token


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying `token` (none without one)."""
    return ((HEADER, SCHEME + token),) if token else ()


@dataclass(frozen=True)
class AuthPolicy:
    """Who may call: holders of `token`, or anyone in `dev_mode`."""

    token: str | None
    dev_mode: bool = False

    def check(self, metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
        """None if the call is allowed, else the reason it is refused (for the caller)."""
        if self.dev_mode:
            return None
        if not self.token:
            return ("admin call refused: this node has no admin token configured; set "
                    "admin.token or admin.token_file on every node (or admin.dev_mode = true "
                    "with a loopback admin.listen, for development)")
        presented = None
        for key, value in metadata:
            if key.lower() == HEADER:
                text = value.decode() if isinstance(value, bytes) else value
                presented = text[len(SCHEME):] if text.startswith(SCHEME) else ""
        if presented is None:
            return ("admin call refused: no token; pass --token-file FILE or --token TOKEN "
                    "(or set MQFED_ADMIN_TOKEN / MQFED_ADMIN_TOKEN_FILE)")
        if not hmac.compare_digest(presented.encode(), self.token.encode()):
            return "admin call refused: wrong token (it does not match this node's admin token)"
        return None
