"""Against the server we replace (skipped where its binary is absent): stores it writes in the test
itself, from scenarios Hypothesis picks, import as it last reported them; and a client connected to it
carries on when it is stopped, its store imported and ours started on the same port."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import anyio
import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import LmdbStore
from streaming.client import StartPosition, connect
from tests.stan_import.support import import_stan
from tests.support.node import NODE_DIR, node
from tests.support.servers import ServerProcess
from tests.support.stan_peer import needs_stan, stan_peer


@pytest.mark.slow
@node
@needs_stan
def test_a_connected_client_carries_on_across_the_switch(tmp_path: Path) -> None:
    with stan_peer(tmp_path / "stan") as peer:
        switcher = subprocess.Popen(
            ["node", str(NODE_DIR / "switch.js"), str(peer.port), "moving"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert switcher.stdout is not None and switcher.stdin is not None
        assert "switch now" in switcher.stdout.readline()
        peer.stop()
    done = import_stan(tmp_path / "stan", tmp_path / "data")
    assert done.returncode == 0, done.stderr
    server = ServerProcess(["-p", str(peer.port), "--dir", str(tmp_path / "data"), "--http_port=-1"]).start()
    try:
        switcher.stdin.write("go\n")
        switcher.stdin.flush()
        out, _ = switcher.communicate(timeout=60)
        result = json.loads(out.strip().splitlines()[-1])
        assert result["ok"], result
        channel = httpx.get(f"http://127.0.0.1:{server.http_port}/streaming/channelsz?channel=moving&subs=1").json()
    finally:
        server.stop()
    for name in ("durable", "plain"):
        got = [(g["seq"], g["redelivered"]) for g in result[name]]
        # Before: 1..10; after the switch: the 5 left unacknowledged again (flagged), then the new one.
        assert got == [(s, False) for s in range(1, 11)] + [(s, True) for s in range(6, 11)] + [(11, False)], got
    subs = channel["subscriptions"]
    assert len(subs) == 2 and all(s["pending_count"] == 0 and s["last_sent"] == 11 for s in subs), subs


scenario = st.lists(  # per channel: its messages, and per durable on it which of them it acknowledges
    st.tuples(
        st.lists(st.binary(max_size=300), min_size=0, max_size=25),
        st.lists(st.lists(st.booleans(), min_size=25, max_size=25), max_size=2),
    ),
    min_size=1,
    max_size=3,
)


@pytest.mark.slow
@needs_stan
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_a_store_it_writes_imports_as_it_last_reported_it(channels: list[tuple[list[bytes], list[list[bool]]]]) -> None:
    with tempfile.TemporaryDirectory() as where:
        root = Path(where)
        with stan_peer(root / "stan", "--file_sync=false") as peer:
            trio.run(_play, peer.port, channels)
            before = httpx.get(f"http://127.0.0.1:{peer.http_port}/streaming/channelsz?subs=1", timeout=5).json()
            peer.stop()
        done = import_stan(root / "stan", root / "data")
        assert done.returncode == 0, done.stderr
        reported = {c["name"]: c for c in before.get("channels", [])}
        with LmdbStore(root / "data") as store:
            for i, (messages, acks) in enumerate(channels):
                name = f"rt.{i}"
                info = store.channel_info(name)
                if not messages and not acks:
                    continue
                assert info is not None and name in reported
                assert (info.first_seq if info.msgs else 0, info.last_seq, info.msgs) == (
                    reported[name]["first_seq"],
                    reported[name]["last_seq"],
                    reported[name]["msgs"],
                )
                assert [m.data for m in store.read(name, 1, len(messages) + 1)] == messages
            state = store.recover()
        for i, (messages, acks) in enumerate(channels):
            for d, acked in enumerate(acks):
                sub = next(s for s in state.subscriptions if s.record.durable_name == f"d{i}.{d}")
                pending = {seq for seq in range(1, len(messages) + 1) if not acked[seq - 1]}
                assert sub.record.last_sent == len(messages)
                assert set(sub.pending) == pending
                page = next(s for s in reported[f"rt.{i}"]["subscriptions"] if s["durable_name"] == f"d{i}.{d}")
                assert page["pending_count"] == len(pending) and page["last_sent"] == len(messages)


async def _play(port: int, channels: list[tuple[list[bytes], list[list[bool]]]]) -> None:
    """Publish each channel's messages, and let each durable get them all and ack what it was given."""
    async with connect("test-cluster", "roundtrip", port=port, request_timeout_s=10) as client:
        for i, (messages, acks) in enumerate(channels):
            for data in messages:
                await client.publish(f"rt.{i}", data)
            for d, acked in enumerate(acks):
                sub = await client.open_subscription(
                    f"rt.{i}", durable=f"d{i}.{d}", manual_ack=True, start_at=StartPosition.FIRST, ack_wait=60
                )
                for _ in messages:
                    with anyio.fail_after(10):
                        msg = await sub.next_msg()
                    if acked[msg.seq - 1]:
                        msg.ack()
                await sub.close()
        await trio.sleep(0.3)  # the acks reach the server before it stops
