"""Logging setup: quiet by default, chosen loggers at debug (`log.debug`)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from sidecar.config import build_config
from sidecar.logs import setup_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    names = ("mqfed.sessions", "mqfed.routing")
    levels = {n: logging.getLogger(n).level for n in names}
    yield
    root.handlers[:], level = saved
    root.setLevel(level)
    for name, lvl in levels.items():
        logging.getLogger(name).setLevel(lvl)


def test_debug_loggers_log_at_debug_while_the_rest_stays_quiet(restore_logging, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    setup_logging("warning", "json", "n1", debug=["mqfed.sessions"])
    logging.getLogger("mqfed.sessions").debug("session action", extra={"client": "c1"})
    logging.getLogger("mqfed.routing").debug("not shown")
    logging.getLogger("mqfed.routing").info("not shown either")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["logger"], x["msg"], x["client"]) for x in lines] == \
        [("mqfed.sessions", "session action", "c1")]


def test_log_debug_is_a_list_from_toml_or_the_environment():
    assert build_config({"node": {"id": "n1"}}, env={})["log"]["debug"] == []
    cfg = build_config({"node": {"id": "n1"}},
                       env={"MQFED_LOG_DEBUG": "mqfed.sessions, mqfed.drain"})
    assert cfg["log"]["debug"] == ["mqfed.sessions", "mqfed.drain"]
