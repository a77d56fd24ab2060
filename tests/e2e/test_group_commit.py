"""Publish commits over real TCP on a real LMDB store: the publishes of a lone publishing connection are
committed by the reader that parsed them (no hop to the publisher task), publishes from many
connections still share commits, and a commit that fails on either path costs only its publishers."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio
import trio.testing

from storage import AppendResult, MessageToAppend, StoreWriteError
from streaming.client import StanError, connect
from tests.support.servers import config, running

CID = "test-cluster"


async def test_a_lone_publishers_publishes_are_committed_by_its_reader(tmp_path: Path) -> None:
    async with (
        running(config(tmp_path)) as server,
        connect(CID, "pub", port=server.port) as pub,
        connect(CID, "sub", port=server.port) as sc,
        sc.subscribe("orders", manual_ack=True) as sub,
    ):
        for i in range(100):
            await pub.publish("orders", b"%d" % i)
            with trio.fail_after(5):
                msg = await sub.next_msg()
            assert msg.data == b"%d" % i
            msg.ack()
        stats = server.core.group_commit.statistics()
        assert stats.messages == 100
        # Every publish is committed on its own; by its reader, unless the disk was slow meanwhile
        # (the suite's other workers share it), when small appends go to the store thread by design.
        assert stats.commits == 100, stats
        assert stats.inline_commits + stats.slow_disk_commits >= 90, stats


async def test_publishes_arriving_together_on_many_connections_share_a_commit(tmp_path: Path) -> None:
    """A reader commits by itself only when no other task is runnable: when several connections'
    publishes arrive at once, all but the last reader leave theirs to the publisher task, which
    commits them together."""
    rounds, clients = 20, 8
    async with running(config(tmp_path)) as server, AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(connect(CID, f"p{c}", port=server.port)) for c in range(clients)]
        for r in range(rounds):
            # Queued on every connection before anything is sent: the client writers then send in
            # one scheduler batch, and the server's readers wake in one too.
            futures = [sc.publish_nowait("shared", b"p%d %d" % (c, r)) for c, sc in enumerate(conns)]
            with trio.fail_after(10):
                for future in futures:
                    await future.wait()
        stats = server.core.group_commit.statistics()
        assert stats.messages == rounds * clients
        assert stats.commits <= 2 * rounds, stats  # one a round here; each reader committing its own: 153
        stored = server.store.read("shared", 1, rounds * clients)
        for c in range(clients):
            assert [m.data for m in stored if m.data.startswith(b"p%d " % c)] == [
                b"p%d %d" % (c, r) for r in range(rounds)
            ]


async def test_a_stream_of_publishes_is_committed_by_the_task(tmp_path: Path) -> None:
    """A reader with more input waiting (a full read) leaves its publishes to the publisher task, whose
    batches then grow while the reader reads on: large ones go to the store thread and overlap the
    parsing. Committing each read's dozen 4 KiB publishes by itself cost a third of the throughput.
    The publisher runs in a thread of its own, so that it streams as a client process would. (How
    many short reads come, which a reader commits itself, depends on timing: the choice itself is
    tested without sockets in tests/core/test_group_commit.py.)"""

    async def publish_stream(port: int) -> None:
        async with connect(CID, "pub", port=port) as pub:
            futures = []
            for i in range(2000):
                futures.append(await pub.publish_async("stream", b"%05d" % i + b"x" * 4096))
            for future in futures:
                await future.wait()

    async with running(config(tmp_path)) as server:
        with trio.fail_after(30):
            await trio.to_thread.run_sync(trio.run, publish_stream, server.port)
        stats = server.core.group_commit.statistics()
        assert stats.messages == 2000
        assert stats.largest_batch > 16 and stats.thread_commits > 0, stats


async def test_wait_commit_returns_at_the_next_commit_or_at_its_bound(tmp_path: Path) -> None:
    """What the subscription-state flusher waits on before it writes (the end of a publish commit,
    bounded): it returns at the next commit, or after the bound when nothing is published."""
    async with running(config(tmp_path)) as server, connect(CID, "pub", port=server.port) as pub:
        publisher = server.core.group_commit
        start = trio.current_time()
        await publisher.wait_commit(0.05)
        assert trio.current_time() - start >= 0.05
        seen: list[int] = []

        async def waiter() -> None:
            await publisher.wait_commit(60)
            seen.append(publisher.statistics().messages)

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                await pub.publish("orders", b"one")
        assert seen == [1]


@pytest.mark.parametrize("by_reader", [True, False], ids=["by-reader", "by-task"])
@pytest.mark.parametrize(
    ("failure", "error"),
    [(StoreWriteError("the write failed (EIO)"), "stan: store error"), (RuntimeError("bug"), "stan: internal error")],
    ids=["store-error", "bug"],
)
async def test_a_failed_commit_refuses_only_its_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception, error: str, by_reader: bool
) -> None:
    async with (
        running(config(tmp_path)) as server,
        connect(CID, "pub", port=server.port) as pub,
        connect(CID, "other", port=server.port) as other,
        connect(CID, "sub", port=server.port) as sc,
        sc.subscribe("orders", manual_ack=True) as sub,
    ):
        await pub.publish("orders", b"before")
        if not by_reader:
            await other.publish("elsewhere", b"x")  # two connections publishing: the task commits
        inline_before = server.core.group_commit.statistics().inline_commits
        append = server.store.append
        failures = [failure]

        def failing_once(messages: Sequence[MessageToAppend], now_unix_ns: int | None = None) -> AppendResult:
            if failures:
                raise failures.pop()
            return append(messages, now_unix_ns)

        monkeypatch.setattr(server.store, "append", failing_once)
        with pytest.raises(StanError, match=error):
            await pub.publish("orders", b"refused")
        assert (server.core.group_commit.statistics().inline_commits > inline_before) is by_reader
        await pub.publish("orders", b"after")
        with trio.fail_after(5):
            got = [(await sub.next_msg()).data for _ in range(2)]
        assert got == [b"before", b"after"]
        assert [m.data for m in server.store.read("orders", 1, 10)] == [b"before", b"after"]
