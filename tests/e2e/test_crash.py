"""SIGKILL the server under publish load, restart it on the same data directory: every message that
got a PubAck is there, and pending messages are redelivered before new ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from streaming.client import Msg, StartPosition, Subscription, connect
from tests.support.servers import ServerProcess, eventually, free_port, state_stored

CID = "test-cluster"


async def drain(sub: Subscription, into: list[Msg]) -> None:
    while True:
        into.append(await sub.next_msg())


@pytest.mark.parametrize("flags", [[], ["--file_sync=false"]], ids=["file_sync", "no_file_sync"])
async def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path, flags: list[str]) -> None:
    """Without an fsync per commit too: a killed server's commits are in the page cache."""
    port = free_port()
    server = ServerProcess(["-p", str(port), "--http_port=-1", "--dir", str(tmp_path / "data"), *flags]).start()
    acked: list[bytes] = []
    received: list[Msg] = []
    try:
        async with (
            connect(CID, "subscriber", port=port, reconnect_wait_s=0.1) as sc,
            connect(CID, "publisher", port=port, reconnect_wait_s=0.1) as pc,
            trio.open_nursery() as nursery,
        ):
            sub = await sc.open_subscription("load", durable="d", manual_ack=True, ack_wait=60, max_inflight=100_000)
            for i in range(10):
                await pc.publish("load", b"warm-%d" % i)
            nursery.start_soon(drain, sub, received)
            await eventually(lambda: len(received) == 10)
            for m in received[:4]:
                m.ack()
            await sc.nats.flush()  # the server has the acks...
            await state_stored(server.http_port)  # ...and has written them (a SIGKILL keeps the page cache)

            async def load() -> None:
                n = 0
                while True:
                    futures = [await pc.publish_async("load", b"load-%d" % (n + i)) for i in range(200)]
                    n += 200
                    for i, future in enumerate(futures):
                        try:
                            await future.wait()
                        except Exception:
                            continue
                        acked.append(future.payload)
                        del i

            nursery.start_soon(load)
            await eventually(lambda: len(acked) > 2000, within=30)
            server.kill()  # SIGKILL, mid-stream
            acked_at_kill = list(acked)
            await trio.sleep(0.2)
            server.start()
            await eventually(lambda: len(acked) > len(acked_at_kill) + 1000, within=30)
            nursery.cancel_scope.cancel()

        # Redelivery order: after the restart every redelivered message came before any new one.
        restart_index = next(i for i, m in enumerate(received) if m.redelivered)
        after = received[restart_index:]
        first_new = next((i for i, m in enumerate(after) if not m.redelivered), len(after))
        assert all(m.redelivered for m in after[:first_new]) and not any(m.redelivered for m in after[first_new:])
        redelivered = {m.seq for m in after[:first_new]}
        assert set(range(5, 11)) <= redelivered  # the unacked warm-up messages came back
        assert redelivered.isdisjoint(range(1, 5))  # acked ones did not

        # Every acknowledged publish is stored, before and after the kill.
        async with connect(CID, "checker", port=port) as cc, cc.subscribe("load", start_at=StartPosition.FIRST) as s:
            stored: set[bytes] = set()
            wanted = set(acked)
            with trio.move_on_after(20):
                while not wanted <= stored:
                    stored.add((await s.next_msg()).data)
        missing = set(acked) - stored
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
        assert set(acked_at_kill) <= stored
    finally:
        server.stop()
