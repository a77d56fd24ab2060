"""The rules behind partitioning and the link, without a network: which channels a partition owns,
when two partitions overlap, what a claim on the wire may hold, and how NATS URLs and nkey seeds read."""

from __future__ import annotations

import base64
import itertools
import os

import nkeys
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.auth import NkeySeed, _signed
from streaming.stan.partitions import Claim, Partition, overlap
from streaming.wire.subjects import matches
from streaming.wire.urls import ServerUrl, discovered, parse_url, parse_urls

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
    for bad in ("", "SUABC", seed.decode()[:-1] + ("A" if seed.decode()[-1] != "A" else "B"), account):
        with pytest.raises(ValueError, match="nkey seed"):
            NkeySeed(bad)
