"""Headless Chromium (Debian's `chromium`) for page tests: the DOM after the page's scripts ran
for a while, and screenshots. One short browser process per call, in its own process group,
killed by that group's id if it overruns; no DevTools client needed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["CHROMIUM", "Row", "artifacts_dir", "dump_dom", "screenshot", "table_rows"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REPO = Path(__file__).resolve().parents[2]


def artifacts_dir(name: str) -> Path:
    """Where a test leaves files to look at (screenshots): $MQFED_TEST_ARTIFACTS/<name>, by
    default tests/artifacts/<name> (ignored by git)."""
    base = Path(os.environ.get("MQFED_TEST_ARTIFACTS") or REPO / "tests" / "artifacts")
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(args: list[str], timeout: float, script: bool = True) -> str:
    assert CHROMIUM, "chromium is not installed"
    with tempfile.TemporaryDirectory(prefix="mqfed-chromium-") as profile:
        if not script:
            # pages' scripts off by the profile's content setting (not --blink-settings,
            # which also stops what headless Chromium itself runs to dump or capture a page)
            (Path(profile) / "Default").mkdir()
            (Path(profile) / "Default" / "Preferences").write_text(json.dumps(
                {"profile": {"default_content_setting_values": {"javascript": 2}}}))
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-extensions", "--disable-background-networking",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"chromium did not finish within {timeout} s: {cmd}") from None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its helpers, if any outlived it
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {err[-2000:]}"
    return out


def dump_dom(url: str, *, script: bool = True, budget_ms: int = 4000,
             timeout: float = 60.0) -> str:
    """The DOM of `url` once its scripts ran `budget_ms` of virtual time (its timers fire,
    its requests complete), or with scripts off."""
    return _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout, script)


def screenshot(url: str, path: Path, *, size: tuple[int, int] = (1600, 1000),
               script: bool = True, budget_ms: int = 4000, timeout: float = 60.0) -> Path:
    """A PNG of `url` after `budget_ms` of virtual time."""
    _run([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}",
          "--hide-scrollbars", f"--screenshot={path}", url], timeout, script)
    assert path.exists() and path.stat().st_size > 1000, f"no screenshot at {path}"
    return path


@dataclass
class Row:
    """One <tr> with its attributes, and its cells' attributes and text."""

    attrs: dict[str, str]
    cells: list[tuple[dict[str, str], str]]


class _Rows(HTMLParser):
    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id = table_id
        self.depth = 0  # inside the element with id table_id
        self.rows: list[Row] = []
        self._cell: tuple[dict[str, str], list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if self.depth == 0 and a.get("id") == self.table_id:
            self.depth = 1
            return
        if self.depth == 0:
            return
        if tag == "div":
            self.depth += 1
        elif tag == "tr":
            self.rows.append(Row(a, []))
        elif tag in ("td", "th") and self.rows:
            self._cell = (a, [])

    def handle_endtag(self, tag: str) -> None:
        if self.depth == 0:
            return
        if tag == "div":
            self.depth -= 1
        elif tag in ("td", "th") and self._cell is not None and self.rows:
            attrs, text = self._cell
            self.rows[-1].cells.append((attrs, re.sub(r"\s+", " ", "".join(text)).strip()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell[1].append(data)


def table_rows(html: str, container_id: str) -> list[Row]:
    """The rows of the table(s) inside the <div id=container_id> of a page."""
    parser = _Rows(container_id)
    parser.feed(html)
    return parser.rows
