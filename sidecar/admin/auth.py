"""Admin authentication: a shared bearer token (sans-IO checks; reading the token file aside).

Every admin call carries `authorization: Bearer <token>` metadata. A node accepts it when the
token matches its own (`admin.token` or `admin.token_file`), or when it runs in the loopback-only
development mode (`admin.dev_mode`, refused at config load on any other listener). Nodes use
their own token when they ask each other, so a cluster shares one admin token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.tokens import AuthError, bearer_metadata, presented_token, read_token, same_token

__all__ = ["AuthError", "AuthPolicy", "bearer_metadata", "read_token"]


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
        presented = presented_token(metadata)
        if presented is None:
            return ("admin call refused: no token; pass --token-file FILE or --token TOKEN "
                    "(or set MQFED_ADMIN_TOKEN / MQFED_ADMIN_TOKEN_FILE)")
        if not same_token(presented, self.token):
            return "admin call refused: wrong token (it does not match this node's admin token)"
        return None
