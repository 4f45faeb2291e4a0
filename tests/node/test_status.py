"""StatusWriter: the status file is written off the loop, one write at a time, and the newest
status wins (a busy disk makes writes skip, never queue up)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from sidecar.node import status as status_mod
from sidecar.node.status import StatusWriter


def test_writes_go_one_at_a_time_and_the_newest_status_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = status_mod._write_text
    calls: list[int] = []

    def slow_write(path: Path, text: str) -> None:
        calls.append(json.loads(text)["n"])
        release.wait(5)
        real(path, text)

    monkeypatch.setattr(status_mod, "_write_text", slow_write)
    path = tmp_path / "state.json"

    async def main() -> StatusWriter:
        writer = StatusWriter(path)
        for n in range(1, 5):  # 1 is written at once (and blocks); 2 and 3 are replaced by 4
            writer.submit({"n": n})
        assert writer.written == 1 and writer.skipped == 2
        release.set()
        for _ in range(200):
            await asyncio.sleep(0.005)
            if writer.written == 2 and not writer._running:
                break
        assert calls == [1, 4]
        assert json.loads(path.read_text()) == {"n": 4}
        return writer

    writer = asyncio.run(main())
    writer.close({"n": 5})  # the last one: at once, on the caller's thread
    assert json.loads(path.read_text()) == {"n": 5} and calls == [1, 4, 5]
    assert not (tmp_path / "state.json.tmp").exists()
