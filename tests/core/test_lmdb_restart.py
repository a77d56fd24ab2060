"""The engine over the LMDB store with real files: a restart rebuilds it from what was written."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import LmdbStore, StartPosition
from streaming.core.engine import Reason, RequestError
from tests.core.harness import Harness


def reopen(h: Harness, directory: Path) -> None:
    h.collect()  # what the runtime's flusher would have written
    h.store.close()
    h.restart(LmdbStore(directory))


def test_restart_over_lmdb_files(tmp_path: Path) -> None:
    h = Harness(LmdbStore(tmp_path))
    h.client("c")
    h.client("other")
    plain = h.subscribe(ack_wait_s=1, max_inflight=10)
    durable = h.subscribe(durable="d", ack_wait_s=1)
    offline = h.subscribe(durable="off", client="other")
    q1 = h.subscribe(queue="g", durable="dq", ack_wait_s=1)
    h.publish("foo", count=4)
    h.ack(plain, 1, 2)
    h.ack(durable, 4)
    h.advance(1)  # attempt 2 for everything unacked
    h.engine.close_subscription(offline, h.now)
    group_pending = sorted(h.engine.inspect.pending(q1))

    reopen(h, tmp_path)

    assert h.take(plain) == [(3, 3, Reason.RESTART), (4, 3, Reason.RESTART)], "attempts continue from disk"
    assert [s for s, _, _ in h.take(durable)] == [1, 2, 3]
    assert sorted(s for s, _, _ in h.take(q1)) == group_pending
    assert h.take(offline) == [], "an offline durable gets nothing until resumed"
    h.publish("foo", b"5")
    assert h.seqs(plain) == [5], "then new messages, from where each subscription was"
    assert h.seqs(durable) == [5]
    h.ack(plain, 3, 4, 5)
    resumed = h.subscribe(durable="off", client="other")
    assert resumed == offline
    assert [s for s, _, r in h.take(offline) if r is Reason.RESUME] == [1, 2, 3, 4]

    reopen(h, tmp_path)
    assert h.take(plain) == [], "acks made after the first restart were persisted too"
    with pytest.raises(RequestError, match="duplicate durable registration"):
        h.subscribe(durable="d", start=StartPosition.FIRST)  # it came back online with its client
    h.store.close()
