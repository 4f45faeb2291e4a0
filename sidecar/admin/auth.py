"""Admin authentication: who may call, and why a call is refused (sans-IO).

Every admin call carries a proof that the caller holds the cluster's admin token
(`admin.token` or `admin.token_file`), never the token itself (`sidecar.challenge`), and the
node answers with its own proof, so `mqfed ctl` and other nodes know they asked a holder of
the token. A node in the loopback-only development mode (`admin.dev_mode`, refused at config
load on any other listener) accepts calls without a proof. Nodes use their own token when they
ask each other, so a cluster shares one admin token.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.tokens import AuthError, read_token

__all__ = ["AuthError", "AuthPolicy", "read_token"]

NO_TOKEN_HELP = ("pass --token-file FILE (or set MQFED_ADMIN_TOKEN_FILE or MQFED_ADMIN_TOKEN)")


@dataclass(frozen=True)
class AuthPolicy:
    """Who may call: holders of `token`, or anyone in `dev_mode`."""

    token: str | None
    dev_mode: bool = False

    def refusal(self, proof: str | None, bearer: bool) -> str | None:
        """None if a call is allowed, else the reason it is refused (for the caller).
        `proof`: "ok" if the call proved the token, the reason its proof failed, or None
        when it carried none; `bearer`: it presented a token itself (an older mqfed ctl)."""
        if proof == "ok" or self.dev_mode:
            return None
        if not self.token:
            return ("admin call refused: this node has no admin token configured; set "
                    "admin.token or admin.token_file on every node (or admin.dev_mode = true "
                    "with a loopback admin.listen, for development)")
        if proof is not None:
            return f"admin call refused: {proof}"
        if bearer:
            return ("admin call refused: the caller sent the admin token itself (an older "
                    "mqfed); this node accepts only a proof of the token: upgrade the caller")
        return f"admin call refused: no token; {NO_TOKEN_HELP}"
