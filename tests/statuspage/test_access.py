"""Who may read the status page: the admin token as Bearer or Basic password, or anyone on a
loopback listener unless that is turned off."""

from __future__ import annotations

import base64

import pytest

from sidecar.config import build_config
from sidecar.statuspage.access import PageAccess, page_access, presented_token


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_bearer_and_basic_carry_the_token() -> None:
    assert presented_token("Bearer s3cret") == "s3cret"
    assert presented_token("bearer  s3cret ") == "s3cret"
    assert presented_token(basic("anyone", "s3cret")) == "s3cret"
    assert presented_token(basic("anyone", "a:b")) == "a:b"
    assert presented_token(basic("anyone", "")) is None
    assert presented_token("Basic !!!") is None
    assert presented_token("Digest x") is None
    assert presented_token("") is None


def test_token_required_unless_open() -> None:
    access = PageAccess("s3cret")
    assert access.refusal({"authorization": "Bearer s3cret"}) is None
    assert access.refusal({"authorization": basic("me", "s3cret")}) is None
    assert access.refusal({}) == "the status page needs the admin token"
    assert access.refusal({"authorization": "Bearer nope"}) == "wrong admin token"
    assert "no admin token" in PageAccess(None).refusal({"authorization": "Bearer x"})
    assert PageAccess(None, open=True).refusal({}) is None


@pytest.mark.parametrize(("listen", "setting", "is_open"), [
    ("127.0.0.1:9101", True, True), ("[::1]:9101", True, True),
    ("localhost:9101", True, True), ("127.0.0.1:9101", False, False),
    ("0.0.0.0:9101", True, False), ("10.0.0.5:9101", True, False)])
def test_open_only_on_loopback(listen: str, setting: bool, is_open: bool) -> None:
    assert page_access("t", listen, setting).open is is_open


def test_config_key_defaults_to_open_on_loopback() -> None:
    cfg = build_config({"node": {"id": "n1"}}, env={})
    assert cfg["admin"]["status_page_open_on_loopback"] is True
    env = {"MQFED_ADMIN_STATUS_PAGE_OPEN_ON_LOOPBACK": "false"}
    assert build_config({"node": {"id": "n1"}}, env=env)[
        "admin"]["status_page_open_on_loopback"] is False
