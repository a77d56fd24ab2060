"""`file_sync = false`: the store is flushed every `sync_interval`, and a failed flush is logged
without stopping the next ones (commits go on meanwhile)."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import trio

from storage import MemoryStore, StoreWriteError
from streaming.server import sync_periodically
from tests.support.servers import config, running


class FlushCounting(MemoryStore):
    """A store that does not sync its commits; its second flush fails as a dying disk would."""

    synced = False

    def __init__(self) -> None:
        super().__init__("test-cluster")
        self.flushed_at: list[float] = []

    def sync(self) -> None:
        self.flushed_at.append(trio.current_time())
        if len(self.flushed_at) == 2:
            raise StoreWriteError("the write failed (EIO)")


async def test_an_unsynced_store_is_flushed_every_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlushCounting()
    start = trio.current_time()
    with trio.move_on_after(3.5):
        await sync_periodically(store, 1.0, in_thread=False)
    assert [round(t - start, 6) for t in store.flushed_at] == [1.0, 2.0, 3.0]  # on after the failure
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "could not flush the store to disk" in errors[0].getMessage()
    assert "EIO" in errors[0].getMessage()


async def test_the_server_opens_the_store_as_configured_and_says_so(tmp_path: Path) -> None:
    for file_sync in (True, False):
        async with running(config(tmp_path / str(file_sync), file_sync=file_sync, http_port=-1)) as server:
            assert server.store.synced is file_sync
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
                storez = (await http.get("/streaming/storez")).json()
            assert storez["file_sync"] is file_sync
