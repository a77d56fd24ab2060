"""Every store nats-streaming-server wrote (tests/stan_import/stores) imports as its manifest says: the
messages at their sequences with their data and timestamps, the channels' bounds, the registered
clients, every subscription with its position and pending messages; the source is left byte for byte
as it was. Then our server runs on the result, and node-nats-streaming (a client we did not write)
reads every channel and resumes every durable and durable queue group: exactly its pending messages
first, flagged as redelivered, then the ones after its position, and never one it had acknowledged.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from storage import LmdbStore
from tests.stan_import.support import STORES, digests, import_stan, manifest
from tests.support.node import NODE_DIR, node
from tests.support.servers import ServerProcess

IMPORTABLE = ["basic", "slices_limits", "encrypted_aes", "encrypted_chacha", "crc_poly", "truncated_tail", "large"]


def flags(name: str) -> list[str]:
    found: list[str] = manifest(name)["import"]["flags"]
    return [*found, "--drop_partial_tail"] if name == "truncated_tail" else found


def kept(channel: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in channel["messages"] if not m.get("torn")]


def bounds(channel: dict[str, Any]) -> tuple[int, int]:
    messages = kept(channel)
    return messages[0]["seq"], messages[-1]["seq"]


def still_pending(sub: dict[str, Any], channels: dict[str, dict[str, Any]]) -> list[int]:
    """What stays pending: the messages below the channel's first sequence are gone."""
    first, _ = bounds(channels[sub["channel"]])
    return [seq for seq in sub["pending"] if seq >= first]


@pytest.fixture(scope="module", params=IMPORTABLE)
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, str]:
    name: str = request.param
    target = tmp_path_factory.mktemp(name) / "data"
    before = digests(STORES / name)
    done = import_stan(STORES / name, target, *flags(name))
    assert done.returncode == 0, done.stderr
    assert digests(STORES / name) == before == {f["path"]: f["sha256"] for f in manifest(name)["files"]}
    return name, target, done.stdout


def test_the_store_holds_what_the_manifest_says(imported: tuple[str, Path, str]) -> None:
    name, target, _ = imported
    m = manifest(name)
    with LmdbStore(target, m["server"]["cluster_id"]) as store:
        channels = {c.name: c for c in store.channels()}
        assert sorted(channels) == sorted(c["name"] for c in m["channels"])
        for channel in m["channels"]:
            info = channels[channel["name"]]
            messages = kept(channel)
            assert (info.first_seq, info.last_seq, info.msgs) == (*bounds(channel), len(messages))
            stored = store.read(channel["name"], info.first_seq, len(messages) + 1)
            assert [s.seq for s in stored] == [e["seq"] for e in messages]
            for s, e in zip(stored, messages, strict=True):
                assert s.timestamp_unix_ns == e["timestamp"]
                assert hashlib.sha256(s.data).hexdigest() == e["sha256"]
                if "data_b64" in e:
                    assert s.data == base64.b64decode(e["data_b64"])
        state = store.recover()
    assert {c.client_id: c.hb_inbox for c in state.clients} == {c["client_id"]: c["hb_inbox"] for c in m["clients"]}
    by_channel = {c["name"]: c for c in m["channels"]}
    found = {
        (s.record.channel, s.record.client_id, s.record.durable_name, s.record.queue_group): s
        for s in state.subscriptions
    }
    assert len(found) == len(m["subscriptions"])
    for sub in m["subscriptions"]:
        got = found[(sub["channel"], sub["client_id"], sub["durable_name"], sub["queue_group"])]
        assert got.record.last_sent == sub["last_sent"]
        assert sorted(got.pending) == still_pending(sub, by_channel)
        assert (got.record.max_inflight, got.record.ack_wait_ms) == (sub["max_inflight"], sub["ack_wait"] * 1000)
        assert got.record.is_durable == sub["is_durable"]
        assert got.record.is_closed == sub["is_offline"]


def resume_plan(m: dict[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[list[int], int, int]]]:
    """node's plan (every channel read whole, every durable and durable group resumed) and, per resumed
    one, what it must get: its pending messages, then the rest of the channel after its position."""
    channels = {c["name"]: c for c in m["channels"]}
    plan: list[dict[str, Any]] = [{"channel": c["name"], "replay": True, "want": len(kept(c))} for c in m["channels"]]
    wanted: list[tuple[list[int], int, int]] = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for sub in m["subscriptions"]:
        if sub["is_durable"]:
            groups.setdefault((sub["channel"], sub["durable_name"], sub["queue_group"]), []).append(sub)
    for (channel, durable, group), subs in sorted(groups.items()):
        pending = sorted({seq for sub in subs for seq in still_pending(sub, channels)})
        last_sent = max(sub["last_sent"] for sub in subs)
        first, last = bounds(channels[channel])
        after = max(last_sent, first - 1)  # what is gone below the first sequence is skipped
        clients = sorted({sub["client_id"] for sub in subs})
        want = len(pending) + max(0, last - after)
        plan.append(
            {
                "channel": channel,
                "durable": durable,
                "group": group,
                "clients": clients,
                "want": want,
                "max_inflight": 4096,
            }
        )
        wanted.append((pending, after, last))
    return plan, wanted


@pytest.mark.slow
@node
def test_node_nats_streaming_reads_and_resumes_what_was_imported(imported: tuple[str, Path, str]) -> None:
    name, target, _ = imported
    m = manifest(name)
    server = ServerProcess(
        ["-p", "0", "--dir", str(target), "--http_port=-1", "--cluster_id", m["server"]["cluster_id"]]
    )
    server.start()
    try:
        pages = httpx.get(f"http://127.0.0.1:{server.http_port}/streaming/channelsz?subs=1", timeout=10).json()
        on_page = {c["name"]: c for c in pages["channels"]}
        for channel in m["channels"]:
            first, last = bounds(channel)
            page = on_page[channel["name"]]
            assert (page["first_seq"], page["last_seq"], page["msgs"]) == (first, last, len(kept(channel)))
        plan, wanted = resume_plan(m)
        done = subprocess.run(
            ["node", str(NODE_DIR / "resume.js"), str(server.port), m["server"]["cluster_id"], json.dumps(plan)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert lines, done.stderr
        result = json.loads(lines[-1])
        assert result["ok"], result
    finally:
        server.stop()
    replays, resumed = result["results"][: len(m["channels"])], result["results"][len(m["channels"]) :]
    for channel, got in zip(m["channels"], replays, strict=True):
        messages = kept(channel)
        assert [g["seq"] for g in got] == [e["seq"] for e in messages]
        assert [g["sha256"] for g in got] == [e["sha256"] for e in messages]
        # JavaScript numbers hold a nanosecond timestamp to within a few hundred nanoseconds.
        assert all(abs(g["timestamp"] - e["timestamp"]) < 1000 for g, e in zip(got, messages, strict=True))
    for (pending, after, last), got in zip(wanted, resumed, strict=True):
        first_ones, rest = got[: len(pending)], got[len(pending) :]
        assert sorted(g["seq"] for g in first_ones) == pending and all(g["redelivered"] for g in first_ones), got
        assert [g["seq"] for g in rest] == list(range(after + 1, last + 1)), got
        assert not any(g["redelivered"] for g in rest)


def test_it_says_what_it_found_and_wrote(imported: tuple[str, Path, str]) -> None:
    name, target, out = imported
    m = manifest(name)
    assert out.startswith(f"found: cluster {m['server']['cluster_id']!r}, {len(m['channels'])} channels")
    for channel in m["channels"]:
        first, last = bounds(channel)
        assert f"channel {channel['name']!r}: {len(kept(channel))} messages, sequences {first}..{last}" in out
    assert f"wrote {target}: {len(m['channels'])} channels" in out
