"""Headless Chromium (Debian's `chromium`) for page tests.

- `dump_dom` / `screenshot`: one short browser process per call (the DOM after the page's
  scripts ran for a while of virtual time, or with scripts off; a PNG);
- `Browser`: a live page driven over the DevTools protocol on a pipe
  (`--remote-debugging-pipe`: JSON messages ending in NUL on fds 3 and 4, so no WebSocket
  client is needed): evaluate script in it (type, click, read), wait for a condition,
  capture it.

Every browser runs in its own process group, killed by that group's id when done."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

__all__ = ["CHROMIUM", "Browser", "Row", "artifacts_dir", "dump_dom", "screenshot",
           "table_rows"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REPO = Path(__file__).resolve().parents[2]


def artifacts_dir(name: str) -> Path:
    """Where a test leaves files to look at (screenshots): $MQFED_TEST_ARTIFACTS/<name>, by
    default tests/artifacts/<name> (ignored by git)."""
    base = Path(os.environ.get("MQFED_TEST_ARTIFACTS") or REPO / "tests" / "artifacts")
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--disable-background-networking", "--disable-dev-shm-usage")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the browser's helpers, if any outlived it
    except ProcessLookupError:
        pass


def _run(args: list[str], timeout: float, script: bool = True) -> str:
    assert CHROMIUM, "chromium is not installed"
    with tempfile.TemporaryDirectory(prefix="mqfed-chromium-") as profile:
        if not script:
            # pages' scripts off by the profile's content setting (not --blink-settings,
            # which also stops what headless Chromium itself runs to dump or capture a page)
            (Path(profile) / "Default").mkdir()
            (Path(profile) / "Default" / "Preferences").write_text(json.dumps(
                {"profile": {"default_content_setting_values": {"javascript": 2}}}))
        cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            raise AssertionError(f"chromium did not finish within {timeout} s: {cmd}") from None
        finally:
            _kill_group(proc.pid)
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


class Browser:
    """One headless Chromium with one page, driven over the DevTools protocol on a pipe.
    Use as a context manager; every call fails the test after `timeout` seconds."""

    def __init__(self, size: tuple[int, int] = (1600, 1000), timeout: float = 30.0) -> None:
        assert CHROMIUM, "chromium is not installed"
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="mqfed-chromium-")
        # the pipe's ends above fd 9, so moving them to fds 3 and 4 cannot overwrite them
        to_chromium, from_us = os.pipe()
        to_us, from_chromium = os.pipe()
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chromium, from_chromium)]
        os.close(to_chromium)
        os.close(from_chromium)
        r, w = ends
        self._log = open(Path(self._profile.name) / "chromium.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{r} 4>&{w} {r}<&- {w}>&-', CHROMIUM, *FLAGS,
             f"--user-data-dir={self._profile.name}", "--remote-debugging-pipe",
             "about:blank"], pass_fds=(r, w), stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=self._log, start_new_session=True)
        os.close(r)
        os.close(w)
        self._out, self._in = from_us, to_us
        self._buffer = b""
        self._id = 0
        try:
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self._call("Target.attachToTarget",
                                       {"targetId": target, "flatten": True})["sessionId"]
            self.call("Page.enable")
            self.call("Emulation.setDeviceMetricsOverride", {
                "width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, params: dict | None = None,
              session: str | None = None) -> dict:
        self._id += 1
        message: dict = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" not in self._buffer:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self._in], [], [], max(left, 0))
                assert ready, f"chromium did not answer {method} within {self.timeout} s"
                chunk = os.read(self._in, 1 << 16)
                assert chunk, f"chromium closed its DevTools pipe during {method}"
                self._buffer += chunk
            raw, _, self._buffer = self._buffer.partition(b"\0")
            reply = json.loads(raw)
            if reply.get("id") == self._id:  # (events have no id)
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply.get("result", {})

    def call(self, method: str, params: dict | None = None) -> dict:
        """A DevTools command on the page."""
        return self._call(method, params, self._session)

    def open(self, url: str) -> None:
        """Navigate and wait for the document to be loaded."""
        self.call("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete' && location.href !== 'about:blank'",
                  what=f"{url} loaded")

    def eval(self, expression: str) -> object:
        """The value of a script expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        assert "exceptionDetails" not in result, f"{expression}: {result['exceptionDetails']}"
        return result["result"].get("value")

    def wait(self, condition: str, timeout: float = 15.0, what: str = "") -> float:
        """Poll a script condition until true; the seconds it took."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.eval(f"Boolean({condition})"):
                return time.monotonic() - start
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")

    def html(self) -> str:
        return str(self.eval("document.documentElement.outerHTML"))

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._call("Browser.close")
            except (AssertionError, OSError):
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(self.proc.pid)
        self.proc.wait()
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        self._profile.cleanup()
