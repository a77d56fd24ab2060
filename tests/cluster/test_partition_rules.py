"""The rules behind partitioning and the link, without a network: which channels a partition owns,
when two partitions overlap, what a claim on the wire may hold, and how NATS URLs and nkey seeds read."""

from __future__ import annotations

import base64
import itertools
import os
import random
from pathlib import Path

import nkeys
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bench.peers import nats_cluster
from streaming.security.auth import NkeySeed, _signed
from streaming.stan.partitions import (
    Claim,
    HashPartition,
    Partition,
    channel_partition,
    overlap,
    parse_hash_partition,
    worker_mappings,
)
from streaming.wire import nats as p
from streaming.wire.subjects import matches
from streaming.wire.urls import ServerUrl, discovered, parse_url, parse_urls
from tests.support.servers import RawClient

TOKENS = ["a", "b"]
# Up to three tokens, then perhaps `>`.
pattern_tokens = st.tuples(st.lists(st.sampled_from([*TOKENS, "*"]), max_size=3), st.booleans()).map(
    lambda t: [*t[0], ">"] if t[1] else t[0]
)


def _subjects(max_len: int) -> list[list[str]]:
    return [list(t) for n in range(1, max_len + 1) for t in itertools.product(TOKENS, repeat=n)]


@given(pattern_tokens.filter(bool), pattern_tokens.filter(bool))
def test_overlap_is_exactly_some_channel_matching_both(a: list[str], b: list[str]) -> None:
    # Patterns of two letters have a witness of two letters if any (a wildcard takes either), and of
    # at most four tokens (three, then one for `>`).
    witness = any(matches(a, s) and matches(b, s) for s in _subjects(5))
    assert overlap(a, b) == witness
    assert overlap(b, a) == witness


def test_a_partition_owns_the_channels_its_patterns_match() -> None:
    partition = Partition(["orders.>", "audit", "stock.*"])
    assert partition.owns("orders.eu") and partition.owns("orders.eu.paris") and partition.owns("audit")
    assert partition.owns("stock.x")
    assert not partition.owns("orders") and not partition.owns("audit.x") and not partition.owns("stock.x.y")
    assert partition.overlapping(["orders.eu", "billing"]) == ["orders.>"]
    assert partition.overlapping(["stock.>", "*"]) == ["audit", "stock.*"]
    assert partition.overlapping(["billing.>"]) == []
    with pytest.raises(ValueError, match="needs the channels"):
        Partition([])
    with pytest.raises(ValueError, match="not a channel"):
        Partition(["orders..eu"])


def test_claims_round_trip_and_anything_else_is_ignored() -> None:
    claim = Claim("A", "t1", 1700000000.5, ("orders.>",))
    assert Claim.decode(claim.encode()) == claim
    later = Claim("C", "t0", 1700000001.0, ("orders.eu",))
    assert later.newer_than(claim) and not claim.newer_than(later)
    for junk in (b"", b"{}", b"[1]", b'{"server": 1}', b"\xff\xfe", b'{"server":"x","token":"y","started":"z"}'):
        assert Claim.decode(junk) is None


@given(st.binary(max_size=200))
def test_any_bytes_on_the_claims_subject_decode_or_are_ignored(data: bytes) -> None:
    decoded = Claim.decode(data)
    assert decoded is None or isinstance(decoded, Claim)


def test_nats_urls_as_users_write_them() -> None:
    assert parse_url("nats://h:4333") == ServerUrl("h", 4333)
    assert parse_url("h") == ServerUrl("h", 4222)
    assert parse_url("tls://h") == ServerUrl("h", 4222, tls=True)
    assert parse_url("nats://bob:s%40cret@h:1") == ServerUrl("h", 1, "bob", "s@cret")
    assert parse_url("nats://tok@h") == ServerUrl("h", token="tok")
    assert str(parse_url("nats://bob:secret@h:1")) == "nats://h:1", "logs never show credentials"
    assert parse_urls("nats://a:1, nats://b:2,nats://a:1") == [ServerUrl("a", 1), ServerUrl("b", 2)]
    refused = (("http://h", "nats:// or tls://"), ("nats://h:x", "port"), ("", "empty"), ("nats://h/p", "expected"))
    for bad, why in refused:
        with pytest.raises(ValueError, match=why):
            parse_url(bad)
    # Nodes an INFO lists keep the credentials of the URL in use.
    like = parse_url("nats://bob:pw@a:1")
    assert discovered(["b:2", "bad:port:x", 7], like) == [ServerUrl("b", 2, "bob", "pw")]
    assert discovered(None, like) == []


def test_an_nkey_seed_signs_as_the_nkeys_library_does() -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    ours, theirs = NkeySeed(seed.decode()), nkeys.from_seed(bytearray(seed))
    assert ours.public == theirs.public_key.decode()
    assert _signed(ours.public, ours.sign("nonce-1"), "nonce-1")
    assert theirs.verify(b"nonce-1", base64.urlsafe_b64decode(ours.sign("nonce-1") + "=="))
    account = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT).decode()
    text = seed.decode()
    damaged = text[:10] + ("A" if text[10] != "A" else "B") + text[11:]  # the CRC no longer matches
    for bad in ("", "SUABC", damaged, account):
        with pytest.raises(ValueError, match="nkey seed"):
            NkeySeed(bad)


def test_hash_partitions_claim_and_own_as_their_layout_says() -> None:
    three = [HashPartition(i, 3) for i in range(3)]
    channels = [f"ch{i}" for i in range(60)] + ["a.b.c.d.e.f.g.h.i.j", "orders.eu"]
    for channel in channels:
        assert sum(p.owns(channel) for p in three) == 1, "each channel has exactly one owner"
    assert all(any(p.owns(c) for c in channels) for p in three), "every worker gets some"
    assert three[0].overlapping(three[1].patterns) == []
    assert three[0].overlapping(HashPartition(0, 3).patterns) == ["#0/3"]
    assert three[0].overlapping(HashPartition(1, 4).patterns) == ["#0/3"], "two layouts on one cluster ID"
    assert three[0].overlapping(["orders.>"]) == ["#0/3"] and Partition(["x"]).overlapping(["#1/3"]) == ["x"]
    assert parse_hash_partition("2/3").owns("ch5") == three[2].owns("ch5")
    for bad in ("3/3", "1", "a/b", "-1/3"):
        with pytest.raises(ValueError, match="expected"):
            parse_hash_partition(bad)


async def test_our_channel_hash_is_the_partition_nats_server_maps_to(tmp_path: Path) -> None:
    """Workers own subscription requests by the same hash that nats-server's mappings route their
    publishes with: checked against a real nats-server for channels of 1 to 12 tokens."""
    count = 5
    rng = random.Random(7)
    channels = [
        ".".join("".join(rng.choice("abcxyz019-_") for _ in range(rng.randint(1, 6))) for _ in range(tokens))
        for tokens in range(1, 13)
        for _ in range(15)
    ]
    with nats_cluster(1, extra=worker_mappings("c", count)) as (node,):
        raw = await RawClient.open(node.port)
        await raw.send(
            b"SUB _STAN.wpub.c.> 1\r\n"
            + b"".join(p.encode_pub(f"_STAN.pub.c.{ch}", "", ch.encode()) for ch in channels)
        )
        seen: dict[str, str] = {}
        with trio.fail_after(10):
            while len(seen) < len(channels):
                event = await raw.next()
                if isinstance(event, p.Msg):
                    seen[event.payload.decode()] = event.subject
        await raw.aclose()
    for channel, subject in seen.items():
        tokens = subject.split(".")
        assert int(tokens[3]) == channel_partition(channel, count), (channel, subject)
        assert HashPartition(int(tokens[3]), count).owns(channel)
        assert tokens[4:] == channel.split(".")[8:], "tokens past the hashed ones follow the partition"
