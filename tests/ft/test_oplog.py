"""The log's records as bytes: every record comes back as it went in, and no bytes make the decoder
fail other than with `LogRecordError`."""

from __future__ import annotations

import contextlib

import hypothesis.strategies as st
import pytest
from hypothesis import given

from storage import ClientRecord, SaveSubscription, SetPending
from storage.records import (
    ClearPending,
    ClearPendingRun,
    DeleteClient,
    DeleteSubscription,
    NewMessage,
    SaveClient,
    SetLastSent,
    SetPendingRun,
    SubOptions,
    SubscriptionRecord,
    SubUpdate,
)
from streaming.ft import oplog
from streaming.wire.positions import StartPosition

names = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20)
messages = st.builds(
    NewMessage,
    channel=st.sampled_from(["a", "b", "é.ü", "orders.eu"]),
    data=st.binary(max_size=200),
    reply=st.text(st.characters(blacklist_categories=["Cs"]), max_size=10),
    content_type=st.sampled_from(["", "application/json", "text/plain; charset=utf-8"]),
)


@given(st.lists(messages, min_size=1, max_size=30), st.integers(-(2**63), 2**63 - 1), st.integers(1, 2**63))
def test_an_append_comes_back_as_it_went_in(batch: list[NewMessage], now: int, first: int) -> None:
    record = oplog.Append(now, {m.channel: first for m in batch}, tuple(batch))
    assert oplog.decode(oplog.encode(record)) == record


SUB = SubscriptionRecord(
    7,
    "orders",
    "c1",
    "_INBOX.x",
    "_STAN.ack.test-cluster.y",
    30_000,
    1024,
    durable_name="dur",
    start_position=StartPosition.SEQUENCE_START,
    start_sequence=5,
    options=SubOptions(max_deliver=3, dead_letter_channel="dead", backoff_ms=(100, 200)),
)


@pytest.mark.parametrize(
    "record",
    [
        oplog.Genesis("abc"),
        oplog.Epoch("m1-1234", 3, "digest"),
        oplog.CreateChannel("orders.é"),
        oplog.DeleteChannel("orders"),
        oplog.Expire(1_700_000_000_000_000_000),
        oplog.Apply(
            (
                SaveSubscription(SUB),
                SetPending(7, 9, 2, fresh=True),
                SetPending(7, 13, 3, not_before_ns=1_800_000_000_000_000_000),  # nak'd, with its wait
                SetPendingRun(7, [10, 11, 12]),
                ClearPendingRun(7, [10]),
                SaveClient(ClientRecord("c1", "_INBOX.hb", b"\x00\xff", 1, 5, 3)),
                DeleteClient("c0"),
            )
        ),
    ],
)
def test_every_other_record_comes_back_as_it_went_in(record: oplog.Record) -> None:
    assert oplog.decode(oplog.encode(record)) == record


@given(st.binary(max_size=300))
def test_any_bytes_decode_to_a_record_or_a_clear_error(raw: bytes) -> None:
    with contextlib.suppress(oplog.LogRecordError):
        oplog.decode(raw)


@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_a_damaged_append_is_refused_or_read_as_some_record(batch: list[NewMessage], data: st.DataObject) -> None:
    raw = bytearray(oplog.encode(oplog.Append(1, {m.channel: 1 for m in batch}, tuple(batch))))
    cut = data.draw(st.integers(1, len(raw) - 1))
    with pytest.raises(oplog.LogRecordError):
        oplog.decode(bytes(raw[:cut]))  # a truncated record never passes for a shorter one
    raw[data.draw(st.integers(0, len(raw) - 1))] ^= 0xFF
    with contextlib.suppress(oplog.LogRecordError):
        oplog.decode(bytes(raw))


ids = st.integers(1, 2**63 - 1)
updates = st.one_of(
    st.builds(SetPendingRun, ids, st.lists(ids, max_size=50)),
    st.builds(ClearPendingRun, ids, st.lists(ids, max_size=50)),
    st.builds(SetPending, ids, ids, st.integers(1, 1000), st.booleans(), st.integers(0, 2**63 - 1)),
    st.builds(ClearPending, ids, ids),
    st.builds(SetLastSent, ids, st.integers(0, 2**63 - 1)),
    st.builds(DeleteSubscription, ids),
    st.builds(DeleteClient, names),
)


@given(st.lists(updates, min_size=1, max_size=40))
def test_any_run_of_updates_comes_back_as_it_went_in(batch: list[SubUpdate]) -> None:
    record = oplog.Apply(tuple(batch))
    assert oplog.decode(oplog.encode(record)) == record
