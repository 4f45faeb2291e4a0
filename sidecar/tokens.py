"""Shared bearer tokens on gRPC calls (admin calls, peer streams): reading a token file,
sending one, checking one. Sans-IO apart from `read_token`."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from pathlib import Path

__all__ = ["AuthError", "bearer_metadata", "presented_token", "read_token", "same_token"]


class AuthError(ValueError):
    """The token cannot be read; the message says which file and why."""


HEADER = "authorization"
SCHEME = "Bearer "


def read_token(path: str | Path, what: str = "admin token") -> str:
    """The token in a token file (surrounding whitespace stripped); AuthError if unusable."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise AuthError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not token:
        raise AuthError(f"the {what} file {path} is empty")
    return token


def presented_token(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The bearer token in call metadata ("" if malformed, None if absent)."""
    presented = None
    for key, value in metadata:
        if key.lower() == HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            presented = text[len(SCHEME):] if text.startswith(SCHEME) else ""
    return presented


def same_token(presented: str, expected: str) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(presented.encode(), expected.encode())


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying `token` (none without one)."""
    return ((HEADER, SCHEME + token),) if token else ()
