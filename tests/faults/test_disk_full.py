"""A real server on a disk that fills up (a tmpfs of its own, which another process's file fills but
for 5 MiB), driven from outside: whatever the order of restarts, SIGKILLs, freeing space and
publishing, every acknowledged message is there in the end; and while the disk is full, clients still
connect, subscribe, receive and ack."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import httpx
import pytest
import trio

from streaming.client import StanError, StartPosition, connect
from tests.faults.clients import CID, payload, publish, read_channel
from tests.faults.sandbox import Sandbox, can_mount_private_tmpfs, sandbox
from tests.support.servers import state_stored

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not can_mount_private_tmpfs(), reason="no private mount namespace (unshare -rm) here"),
]

STEPS = ("restart", "kill", "free", "publish")
DISK_MB = 24
ROOM = 5 << 20  # what the other process's file leaves the server


def _start(box: Sandbox, *flags: str) -> None:
    started = box.start(*flags)
    assert "port" in started, "the server must start on a full disk with intact files:\n" + "\n".join(started["log"])


async def _fill_by_publishing(box: Sandbox, acked: set[int], n: int = 0) -> int:
    """Publish until the server refuses (its disk is full), take what space is left, and publish until
    it refuses again: the journal's preallocated room takes messages on a full disk too."""
    filled = False
    while True:
        refused = await publish(box.port, "fill", n, 500, acked)
        n += 500
        if refused and filled:
            return n
        if refused:
            box.fill()
            filled = True


@pytest.mark.parametrize("order", list(itertools.permutations(STEPS)), ids="-".join)
async def test_no_order_of_restart_free_publish_and_kill_loses_an_acknowledged_message(
    tmp_path: Path, order: tuple[str, ...]
) -> None:
    acked: set[int] = set()
    with sandbox(tmp_path / "disk", size_mb=DISK_MB) as box:
        box.fill(leave=ROOM)
        _start(box)
        n = await _fill_by_publishing(box, acked)
        assert len(acked) > 1000
        for step in order:
            if step in ("restart", "kill"):
                stopped = box.stop(signal.SIGTERM if step == "restart" else signal.SIGKILL)
                assert stopped["exit"] in (0, -signal.SIGKILL), "\n".join(stopped["log"])
                _start(box)
            elif step == "free":
                box.free()
            else:
                await publish(box.port, "fill", n, 300, acked)
                n += 300
        box.free()
        box.stop(signal.SIGTERM)
        _start(box)
        stored = await read_channel(box.port, "fill")
        lost = acked - stored.keys()
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
        assert all(data == payload(k) for k, data in stored.items())


async def test_a_full_disk_refuses_writes_and_keeps_serving_readers(tmp_path: Path) -> None:
    acked: set[int] = set()
    with sandbox(tmp_path / "disk", size_mb=DISK_MB) as box:
        box.fill(leave=ROOM)
        _start(box, "-m", "-1")
        await publish(box.port, "orders", 0, 300, acked)
        async with httpx.AsyncClient() as http:
            storez = (await http.get(f"http://127.0.0.1:{box.http_port}/streaming/storez")).json()
            assert (storez["writable"], storez["write_error"]) == (True, None)
        async with connect(CID, "reader", port=box.port) as sc:
            async with sc.subscribe(
                "orders", start_at=StartPosition.FIRST, durable="audit", max_inflight=1, close_on_exit=True
            ):
                pass  # the durable exists; it is closed (kept) here
        await _fill_by_publishing(box, set())
        async with connect(CID, "reader", port=box.port) as sc:  # registering needs a write: none happens
            resumed = sc.subscribe("orders", durable="audit", manual_ack=True, close_on_exit=True)
            async with resumed as sub:  # a resumed durable needs no write
                for _ in range(50):
                    msg = await sub.next_msg()
                    msg.ack()  # kept in memory until the disk takes them
                assert msg.seq == 50
            refusal = ""
            for n in range(10**6, 10**6 + 1000):  # until the preallocated journal room is gone (it nearly is)
                try:
                    await sc.publish("orders", payload(n))
                except StanError as exc:
                    refusal = str(exc)
                    break
            assert refusal == "stan: store error: the server's disk is full: not stored", refusal
            # A new channel needs a write: refused, unless the message log's file still holds room for
            # it (a checkpoint that failed for want of space may have left some there). Either way it
            # is said, never silent: refused with the reason, or made and listed.
            try:
                async with sc.subscribe("brand-new-channel"):
                    pass
            except StanError as exc:
                assert "the server's disk is full" in str(exc)
                made = False
            else:
                made = True
            with pytest.raises(StanError, match="the server's disk is full"):
                async with sc.subscribe("orders", durable="another"):  # it could not be made durable
                    pass
            async with sc.subscribe("orders", start_at=StartPosition.FIRST) as plain:  # in memory: served
                assert (await plain.next_msg()).seq == 1
            async with httpx.AsyncClient() as http:  # what degrades is said
                storez = (await http.get(f"http://127.0.0.1:{box.http_port}/streaming/storez")).json()
                metrics = (await http.get(f"http://127.0.0.1:{box.http_port}/metrics")).text
            assert storez["writable"] is False and "disk full" in storez["write_error"]
            async with httpx.AsyncClient() as http:
                channels = (await http.get(f"http://127.0.0.1:{box.http_port}/streaming/channelsz")).json()
            assert ("brand-new-channel" in channels["names"]) == made
            assert "streaming_store_writable 0.0" in metrics
            box.free()
            with trio.fail_after(10):
                while True:  # the publisher comes back once the store takes commits again
                    try:
                        await sc.publish("orders", payload(2 * 10**6))
                        break
                    except StanError:
                        await trio.sleep(0.2)
        await state_stored(box.http_port)  # the acks and the registration follow the first commit that lands
        box.stop(signal.SIGKILL)
        _start(box)
        async with connect(CID, "reader", port=box.port) as sc:
            async with sc.subscribe("orders", durable="audit", manual_ack=True, close_on_exit=True) as sub:
                msg = await sub.next_msg()
                assert msg.seq == 51, "the acks made on the full disk were kept (51 was sent, not acked)"
        stored = await read_channel(box.port, "orders")
        assert acked <= stored.keys()
