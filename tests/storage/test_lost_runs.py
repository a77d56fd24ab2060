"""What `check` and `repair` say is lost is kept as runs of sequences, never one entry per sequence, so
a damaged position (a sequence in the quadrillions) is reported at once; and a pending entry read from
the pages of a damaged state file that names a message past its channel's end is left out as damage,
not taken as billions of lost messages. A message key of the wrong length in sound pages is reported,
not a traceback, and a short one is named as a damaged key, not as a sequence it cannot hold. Intact
messages that LMDB's search steps over in such a page are reported as missing, never skipped
silently; a channel with gaps of its own (an import's) is not held to that."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import ChannelLimits, DamagedStoreError, IntegrityError, LmdbStore, Message, NewMessage, StoreLimits
from storage.codec import (
    MSG_KEY,
    PENDING_KEY,
    decode_lost,
    decode_message,
    decode_messages,
    encode_head,
    encode_lost,
    encode_message,
    in_spans,
    merge_spans,
    spans,
    subtract_spans,
)
from storage.records import ChannelInfo, SaveSubscription, SetPendingRun, SubscriptionRecord
from storage.repair import check, repair
from storage.salvage import SalvagedChannel

seqs = st.sets(st.integers(1, 200), max_size=60)


@given(a=seqs, b=seqs)
def test_runs_answer_as_sets_of_sequences_do(a: set[int], b: set[int]) -> None:
    runs_a, runs_b = spans(a), spans(b)
    assert {seq for first, last in runs_a for seq in range(first, last + 1)} == a
    assert all(x[1] + 1 < y[0] for x, y in pairwise(runs_a)), "sorted, apart, not touching"
    assert merge_spans([*runs_a, *runs_b]) == spans(a | b)
    assert subtract_spans(runs_a, runs_b) == spans(a - b)
    assert all(in_spans(seq, runs_a) == (seq in a) for seq in range(0, 202))
    assert decode_lost(encode_lost(runs_a)) == runs_a


@given(
    first=st.integers(1, 50),
    length=st.integers(0, 120),
    present=st.sets(st.integers(0, 119)),
    before=seqs,
)
def test_a_channels_lost_runs_are_its_sequences_not_found(
    first: int, length: int, present: set[int], before: set[int]
) -> None:
    last = first + length - 1
    channel = SalvagedChannel(ChannelInfo("c", 1, first_seq=first, last_seq=last), lost_before=spans(before))
    for offset in present:
        channel.mark(first + offset, b"\0" * 16)
    expected = {seq for seq in range(first, last + 1) if seq - first not in present and seq not in before}
    assert channel.lost() == spans(expected)


def test_a_position_in_the_quadrillions_is_one_run() -> None:
    channel = SalvagedChannel(ChannelInfo("c", 1, first_seq=1, last_seq=46_443_371_157_258_877))
    for seq in range(1, 701):
        channel.mark(seq, b"\0" * 16)
    started = time.perf_counter()
    assert channel.lost() == [(701, 46_443_371_157_258_877)]
    assert time.perf_counter() - started < 1.0


def test_a_damaged_pending_key_past_the_channel_is_left_out_not_counted_lost(tmp_path: Path) -> None:
    """The case a CI run met: a byte of a pending entry's key flipped, so the file fails its walk and is
    read page by page, and that entry names message 46,443,371,157,258,877 of a channel of 700."""
    record = SubscriptionRecord(1, "orders", "audit", "_INBOX.a", "_INBOX.ack", ack_wait_ms=30_000, max_inflight=1024)
    with LmdbStore(tmp_path) as store:
        store.ensure_channel("orders")
        store.append([NewMessage("orders", b"m%d" % i) for i in range(700)])
        store.apply([SaveSubscription(record), SetPendingRun(1, list(range(600, 700)))])
    data = tmp_path / "state" / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = raw.find(PENDING_KEY.pack(1, 650))
    assert at > 0
    raw[at + 9] ^= 0xA5  # the sequence's second byte: now far past the channel's end, out of order
    data.write_bytes(bytes(raw))

    started = time.perf_counter()
    report = check(tmp_path)
    assert time.perf_counter() - started < 10
    assert any("leaf keys out of order" in p for p in report.problems), report.problems
    assert any("past the channel's end (700" in p and "left out as damage" in p for p in report.problems)
    assert report.lost == {}
    repaired = repair(tmp_path, None)
    assert repaired.lost == {}
    with LmdbStore(tmp_path) as store:
        assert store.channel_info("orders") is not None
        info = store.channel_info("orders")
        assert info is not None and info.last_seq == 700, "the channel keeps its own end"


def test_a_damaged_key_length_in_sound_pages_is_reported_not_a_traceback(tmp_path: Path) -> None:
    """A node's key size damaged (13 bytes where a message key has 12) leaves the pages sound: `check`
    and the full check report it by file and channel, and a read skips that message."""
    _store_with_a_damaged_key(tmp_path, 50, 20, MSG_KEY.size + 1)

    report = check(tmp_path)
    assert any("a message's key is damaged (13 bytes): left out" in p for p in report.problems), report.problems
    with pytest.raises(DamagedStoreError, match=r"channel 'c': a message's key is damaged \(13 bytes\)"):
        LmdbStore(tmp_path, verify="full")
    with LmdbStore(tmp_path, verify="quick") as store:
        assert [m.seq for m in store.read("c", 1, 100)] == [s for s in range(1, 51) if s != 20]


def test_a_message_read_under_a_short_key_is_reported_by_its_channel_not_as_a_sequence() -> None:
    """A key too short to hold a sequence names no message: the error says the key is damaged."""
    value = encode_message(1, 7, 1_000, encode_head(""), b"payload")[1]
    for key in (b"", b"\x00\x00\x00\x01\x00"):
        with pytest.raises(IntegrityError, match=rf"channel 'c': a message's key is damaged \({len(key)} bytes\)"):
            decode_message(key, value, "c")
        with pytest.raises(IntegrityError, match=r"a message's key is damaged"):
            decode_messages([(key, value)], "c")


def _store_with_a_damaged_key(directory: Path, count: int, seq: int, size: int) -> None:
    """Channel "c" with `count` messages, the key size of the message file's node for `seq` then set
    to `size`: the page stays sound."""
    with LmdbStore(directory) as store:
        store.ensure_channel("c")
        store.append([NewMessage("c", b"m%d" % i) for i in range(count)])
        info = store.channel_info("c")
        assert info is not None
        channel_id = info.channel_id
    data = directory / "msgs" / "data.mdb"
    raw = bytearray(data.read_bytes())
    key = MSG_KEY.pack(channel_id, seq)
    at, found = raw.find(key), 0
    while at >= 0:
        if int.from_bytes(raw[at - 2 : at], "little") == MSG_KEY.size:  # the node's key size, before the key
            raw[at - 2 : at] = size.to_bytes(2, "little")
            found += 1
        at = raw.find(key, at + 1)
    assert found >= 1
    data.write_bytes(bytes(raw))


def test_a_key_too_short_for_a_sequence_ends_no_read_and_no_eviction(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With `quick` a read can end on a key of 11 bytes (too short to hold a sequence): it goes on past
    it, reports it, and an eviction walk over it does not fail either."""
    _store_with_a_damaged_key(tmp_path, 400, 300, MSG_KEY.size - 1)
    limits = StoreLimits(channel=ChannelLimits(max_msgs=50))
    with LmdbStore(tmp_path, verify="quick", limits=limits) as store:
        read = [m.seq for m in store.read("c", 280, 21)]  # the 21st pair read is the damaged one
        assert read[:20] == list(range(280, 300)), read
        assert "a message's key is damaged (11 bytes)" in caplog.text
        store.append([NewMessage("c", b"more")])  # over max_msgs: the eviction walk passes the damaged key
        info = store.channel_info("c")
        assert info is not None and info.last_seq == 401 and info.first_seq > 300


def test_intact_messages_a_damaged_page_hides_are_reported_missing_not_skipped_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Message 300's key cut to 11 bytes: LMDB's search in that page then steps over 298 and 299 (intact).
    _store_with_a_damaged_key(tmp_path, 400, 300, MSG_KEY.size - 1)
    with LmdbStore(tmp_path, verify="quick") as store:
        read = [m.seq for m in store.read("c", 298, 3)]
        assert 298 not in read and 299 not in read, "the premise: LMDB's search steps over them"
        assert "'c': messages 298-300 are missing from the message file (none was removed)" in caplog.text
        assert store.get_many("c", [297, 299, 301])[1] is None
        assert "'c': message 299 is missing" in caplog.text or "messages 298-300" in caplog.text
        assert store.damaged_reads >= 2


def test_with_the_full_check_owed_a_read_ends_before_messages_it_cannot_find(tmp_path: Path) -> None:
    """`background`: until the full check has passed, nothing past damage is served, and the check
    ends at once with what the read found."""
    # Message 300's key cut to 11 bytes: LMDB's search in that page then steps over 298 and 299 (intact).
    _store_with_a_damaged_key(tmp_path, 400, 300, MSG_KEY.size - 1)
    with LmdbStore(tmp_path, verify="background") as store:
        assert store.unchecked
        assert [m.seq for m in store.read("c", 298, 3)] == []
        assert [m.seq for m in store.read("c", 290, 20)] == list(range(290, 300))  # read in page order: intact
        found = store.check_fully()
        assert found is not None and "messages 298-300 are missing from the message file" in found


def test_a_channel_with_gaps_of_its_own_is_read_without_reports(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An import keeps the sequences it found, gaps and all: those gaps are not damage."""
    kept = [*range(1, 11), *range(20, 31)]
    with LmdbStore(tmp_path) as store:
        store.load_channel("c", [Message(seq, 1_000 + seq, "c", "", b"x") for seq in kept], last_seq=30)
    with LmdbStore(tmp_path, verify="background") as store:
        assert [m.seq for m in store.read("c", 1, 100)] == kept
        assert [m.seq for m in store.read("c", 5, 3)] == [5, 6, 7]
        assert [m.seq for m in store.read("c", 11, 3)] == [20, 21, 22]
        assert store.get_many("c", [10, 11, 20]) == [store.get("c", 10), None, store.get("c", 20)]
        assert store.damaged_reads == 0 and store.check_fully() is None
    assert "missing" not in caplog.text
