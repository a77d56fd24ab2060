"""Where the runtime applies subscription-state writes when the store has a worker thread (LMDB in
production): small ones on the worker, so their fsync never holds up the event loop; large ones on
the Trio thread, because py-lmdb lets go of the interpreter lock around every put and delete and a
worker would hand the lock back and forth with the loop twice per update.

Real LMDB in a temp dir and the real clock: under MockClock virtual time would jump while a worker
thread runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import trio

from storage import ClearPendingRun, ClientRecord, LmdbStore, SetPendingRun, SubUpdate
from streaming.core.engine import SubscribeRequest
from streaming.core.outbound import Publish
from streaming.core.runtime import _INLINE_STATE_WRITE
from streaming.core.service import Core
from tests.core.doors import RecordingDoor


class Recorder:
    """Wraps `store.apply`: (store entries the call writes, whether it ran on the Trio thread)."""

    def __init__(self, store: LmdbStore) -> None:
        self.calls: list[tuple[int, bool]] = []
        self._apply = store.apply
        self._trio_thread = threading.get_ident()
        store.apply = self._record  # type: ignore[method-assign]

    def _record(self, updates: Iterable[SubUpdate]) -> None:
        batch = list(updates)
        entries = sum(len(u.seqs) if isinstance(u, SetPendingRun | ClearPendingRun) else 1 for u in batch)
        self.calls.append((entries, threading.get_ident() == self._trio_thread))
        self._apply(batch)


def publish(core: Core, count: int) -> None:
    core.pipeline.commit([Publish("foo", b"x", "", "", "") for _ in range(count)])


async def test_large_state_writes_run_on_the_trio_thread_small_ones_on_the_worker(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "data")
    door = RecordingDoor()
    try:
        store.register_client(ClientRecord("c", "_HB"))
        store.ensure_channel("foo")
        core = Core(store, store_in_thread=True)
        core.doors.add(door)
        recorder = Recorder(store)
        async with trio.open_nursery() as nursery:
            await nursery.start(core.run)
            await core.ready.wait()
            request = SubscribeRequest("c", "foo", "_INBOX.1", "_ACK.1", 30_000, 100_000)
            sub = core.pipeline.subscribe(request, lambda sub_id: None)
            await core.runtime.flush()
            recorder.calls.clear()

            publish(core, 10)  # 10 pending entries and a position: a small write
            await core.runtime.flush()
            small = recorder.calls[:]
            publish(core, 3000)  # 3,000 entries: a large write, in slices
            await core.runtime.flush()
            large = recorder.calls[len(small) :]
            nursery.cancel_scope.cancel()

        assert small and all(n < _INLINE_STATE_WRITE and not on_trio for n, on_trio in small)
        assert sum(n for n, _ in large) >= 3000
        assert all(on_trio for _, on_trio in large), large
        assert len(large) > 1, "sliced, so the loop runs in between"
        assert len(door.sent) == 3010
    finally:
        store.close()

    # Whichever thread wrote them, every entry is there after a restart.
    reopened = LmdbStore(tmp_path / "data")
    try:
        (recovered,) = [s for s in reopened.recover().subscriptions if s.record.sub_id == sub]
        assert sorted(recovered.pending) == list(range(1, 3011))
        assert recovered.record.last_sent == 3010
    finally:
        reopened.close()
