"""Who may read the status page (sans-IO).

The page and its JSON show the cluster to holders of the admin token, sent as
`Authorization: Bearer TOKEN` (the page's login form keeps it in the tab's sessionStorage) or
as the password of HTTP Basic auth (any user name; for browsers without JavaScript and for
curl). A node whose metrics listener is on loopback shows it to anyone who can connect there,
unless `admin.status_page_open_on_loopback` is false: a development cluster on one machine.

The metrics listener is plain HTTP, so the token crosses the network in clear when the page is
opened from another host: reach it through a tunnel or a TLS-terminating proxy there.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.config import is_loopback

__all__ = ["PageAccess", "page_access"]


@dataclass(frozen=True)
class PageAccess:
    """`open`: no token needed; else `token` (None: this node has none, so nobody may read)."""

    token: str | None
    open: bool = False

    def refusal(self, headers: Mapping[str, str]) -> str | None:
        """None if a request with these headers (lower-case names) may read, else why not."""
        if self.open:
            return None
        if not self.token:
            return ("this node has no admin token (admin.token or admin.token_file), so its "
                    "status page is open only on a loopback admin.metrics")
        presented = presented_token(headers.get("authorization", ""))
        if presented is None:
            return "the status page needs the admin token"
        if not hmac.compare_digest(presented.encode(), self.token.encode()):
            return "wrong admin token"
        return None


def presented_token(authorization: str) -> str | None:
    """The token of an `Authorization` header: Bearer TOKEN, or Basic auth's password."""
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return None


def page_access(token: str | None, metrics_listen: str, open_on_loopback: bool) -> PageAccess:
    """The access rule of a node with this admin token, metrics listener and setting."""
    return PageAccess(token, open_on_loopback and is_loopback(metrics_listen))
