"""Cluster tokens: token files, and the published example tokens refused unless allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.tokens import AuthError, check_not_default, read_token


def test_example_tokens_are_refused_unless_allowed_explicitly():
    for token in ("change-me", "change-me-too"):
        with pytest.raises(AuthError, match="example token") as info:
            check_not_default(token, "peer token", {})
        assert "MQFED_ALLOW_DEFAULT_TOKENS=1" in str(info.value)
        check_not_default(token, "peer token", {"MQFED_ALLOW_DEFAULT_TOKENS": "1"})
        with pytest.raises(AuthError):
            check_not_default(token, "admin token", {"MQFED_ALLOW_DEFAULT_TOKENS": "0"})
    check_not_default("a-real-random-secret", "peer token", {})
    check_not_default(None, "admin token", {})


def test_token_files(tmp_path: Path):
    (tmp_path / "t").write_text("  s3cret \n")
    assert read_token(tmp_path / "t") == "s3cret"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(AuthError, match="the peer token file .* is empty"):
        read_token(tmp_path / "empty", "peer token")
    with pytest.raises(AuthError, match="cannot read the admin token file"):
        read_token(tmp_path / "missing")
