"""The store contract: one suite, run against the memory store and the LMDB store.

Tests that need a restart are skipped for the memory store (it is not recoverable); everything else
must behave identically in both.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from storage import (
    ChannelLimits,
    ChannelNameConflictError,
    ClearPending,
    ClientRecord,
    DeleteSubscription,
    NewMessage,
    SaveSubscription,
    SetLastSent,
    SetPending,
    StartPosition,
    StoreLimits,
    SubOptions,
    SubscriptionRecord,
    TooManyChannelsError,
    UnknownChannelError,
)
from storage.codec import message_size
from tests.storage.conftest import StoreMaker

S = 1_000_000_000


def msgs(channel: str, *payloads: bytes) -> list[NewMessage]:
    return [NewMessage(channel, p) for p in payloads]


def sub_record(sub_id: int, channel: str = "foo", **changes: Any) -> SubscriptionRecord:
    base = SubscriptionRecord(sub_id, channel, "me", "_INBOX.a", "_INBOX.ack", ack_wait_ms=30_000, max_inflight=1024)
    return attrs.evolve(base, **changes)


def need_restart(make_store: StoreMaker) -> None:
    if not make_store.recoverable:
        pytest.skip("the memory store is not recoverable")


# -- channels ----------------------------------------------------------------------------------


def test_channels_are_created_on_demand_and_listed(make_store: StoreMaker) -> None:
    store = make_store()
    assert store.channel_info("foo") is None
    foo = store.ensure_channel("foo")
    assert store.ensure_channel("foo") == foo
    bar = store.ensure_channel("bar")
    assert [c.name for c in store.channels()] == ["foo", "bar"]
    assert foo.channel_id != bar.channel_id
    assert (foo.first_seq, foo.last_seq, foo.msgs, foo.bytes) == (1, 0, 0, 0)


def test_channel_names_are_unique_ignoring_case(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("Foo")
    for other in ("foo", "FOO", "fOo"):
        with pytest.raises(ChannelNameConflictError) as err:
            store.ensure_channel(other)
        assert str(err.value) == (
            f'rejecting channel "{other}" because channel "Foo" alreay exists (different cases not allowed)'
        )
    assert [c.name for c in store.channels()] == ["Foo"]


def test_case_clash_is_refused_after_restart(make_store: StoreMaker) -> None:
    need_restart(make_store)
    store = make_store()
    store.ensure_channel("Foo")
    store = make_store.reopen(store)
    with pytest.raises(ChannelNameConflictError):
        store.ensure_channel("foo")
    assert store.ensure_channel("Foo").name == "Foo"


def test_too_many_channels_refuses_without_creating(make_store: StoreMaker) -> None:
    store = make_store(StoreLimits(max_channels=2))
    store.ensure_channel("a")
    store.ensure_channel("b")
    with pytest.raises(TooManyChannelsError, match="too many channels"):
        store.ensure_channel("c")
    assert store.channel_info("c") is None
    assert len(store.channels()) == 2


def test_delete_channel_removes_messages_and_subscriptions(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("foo")
    store.ensure_channel("bar")
    store.append(msgs("foo", b"1", b"2") + msgs("bar", b"x"))
    store.apply([SaveSubscription(sub_record(1, "foo")), SetPending(1, 1, 1), SaveSubscription(sub_record(2, "bar"))])
    store.delete_channel("foo")
    assert store.channel_info("foo") is None
    assert [s.record.sub_id for s in store.recover().subscriptions] == [2]
    again = store.ensure_channel("foo")
    assert store.append(msgs("foo", b"new")).assigned[0][0] == 1, "a re-created channel starts at 1"
    assert [m.data for m in store.read("foo", 1, 10)] == [b"new"]
    assert again.msgs == 0
    assert [m.data for m in store.read("bar", 1, 10)] == [b"x"]


# -- message log -------------------------------------------------------------------------------


def test_append_assigns_contiguous_sequences_per_channel(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    store.ensure_channel("b")
    result = store.append(msgs("a", b"1", b"2") + msgs("b", b"x") + msgs("a", b"3"), now_unix_ns=10 * S)
    assert [seq for seq, _ in result.assigned] == [1, 2, 1, 3]
    assert all(ts == 10 * S for _, ts in result.assigned)
    assert result.dropped == {}
    a = store.channel_info("a")
    assert a is not None
    assert (a.first_seq, a.last_seq, a.msgs) == (1, 3, 3)
    assert a.bytes == 3 * message_size(b"", b"1")
    assert [m.data for m in store.read("a", 1, 10)] == [b"1", b"2", b"3"]


def test_timestamps_never_go_backwards_within_a_channel(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    store.append(msgs("a", b"1"), now_unix_ns=50 * S)
    result = store.append(msgs("a", b"2"), now_unix_ns=40 * S)
    assert result.assigned == [(2, 50 * S)]
    assert store.append(msgs("a", b"3"), now_unix_ns=60 * S).assigned == [(3, 60 * S)]


def test_messages_carry_every_field(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("orders.eu")
    store.append([NewMessage("orders.eu", b"\x00payload\xff", reply="_INBOX.r")], now_unix_ns=7 * S)
    msg = store.get("orders.eu", 1)
    assert msg is not None
    assert (msg.seq, msg.timestamp_unix_ns, msg.subject, msg.reply, msg.data) == (
        1,
        7 * S,
        "orders.eu",
        "_INBOX.r",
        b"\x00payload\xff",
    )
    assert store.get("orders.eu", 2) is None
    assert store.get("orders.eu", 0) is None


def test_a_content_type_is_kept_with_its_message_and_counted(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("docs")
    store.append(
        [NewMessage("docs", b'{"a":1}', content_type="application/json"), NewMessage("docs", b"plain")],
        now_unix_ns=3 * S,
    )
    typed, bare = store.read("docs", 1, 2)
    assert (typed.content_type, typed.data, bare.content_type) == ("application/json", b'{"a":1}', "")
    info = store.channel_info("docs")
    assert info is not None
    assert info.bytes == message_size(b"", b'{"a":1}', "application/json") + message_size(b"", b"plain")
    if make_store.recoverable:  # from the journal, then from LMDB after a checkpoint
        store = make_store.reopen(store)
        assert [m.content_type for m in store.read("docs", 1, 2)] == ["application/json", ""]


def test_get_many_returns_scattered_messages_in_the_order_asked(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    store.append(msgs("a", *[b"m%d" % i for i in range(1, 11)]), now_unix_ns=1 * S)
    got = store.get_many("a", [7, 2, 99, 10, 2, 0])
    assert [m.data if m is not None else None for m in got] == [b"m7", b"m2", None, b"m10", b"m2", None]
    assert all(m is None or (m.subject, m.timestamp_unix_ns) == ("a", 1 * S) for m in got)
    assert store.get_many("a", []) == []


def test_empty_payload_is_a_message(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    store.append(msgs("a", b""))
    assert [m.data for m in store.read("a", 1, 5)] == [b""]


def test_append_to_unknown_channel_writes_nothing(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    with pytest.raises(UnknownChannelError):
        store.append(msgs("a", b"1") + msgs("nope", b"2"))
    info = store.channel_info("a")
    assert info is not None
    assert info.last_seq == 0
    assert store.read("a", 1, 10) == []


def test_oversized_reply_fails_the_whole_batch(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    with pytest.raises(ValueError, match="reply subject"):
        store.append([NewMessage("a", b"ok"), NewMessage("a", b"x", reply="r" * 70_000)])
    assert store.read("a", 1, 10) == []


def test_read_ranges(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    store.append(msgs("a", *[str(i).encode() for i in range(1, 11)]))
    assert [m.seq for m in store.read("a", 4, 3)] == [4, 5, 6]
    assert [m.seq for m in store.read("a", 9, 100)] == [9, 10]
    assert store.read("a", 11, 5) == []
    assert store.read("a", 1, 0) == []
    assert [m.seq for m in store.read("a", 0, 2)] == [1, 2]


def test_first_sequence_at_or_after_a_timestamp(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    assert store.first_seq_at_or_after("a", 0) == 1, "empty channel: from 1"
    for t in (10, 20, 20, 30):
        store.append(msgs("a", b"m"), now_unix_ns=t * S)
    assert store.first_seq_at_or_after("a", 0) == 1
    assert store.first_seq_at_or_after("a", 10 * S) == 1
    assert store.first_seq_at_or_after("a", 15 * S) == 2
    assert store.first_seq_at_or_after("a", 20 * S) == 2
    assert store.first_seq_at_or_after("a", 25 * S) == 4
    assert store.first_seq_at_or_after("a", 31 * S) == 5, "after the last message: only new ones"


# -- retention limits --------------------------------------------------------------------------


def test_max_msgs_evicts_the_oldest_and_reports_them(make_store: StoreMaker) -> None:
    store = make_store(StoreLimits(channel=ChannelLimits(max_msgs=3)))
    store.ensure_channel("a")
    assert store.append(msgs("a", b"1", b"2", b"3")).dropped == {}
    result = store.append(msgs("a", b"4", b"5"))
    assert result.dropped == {"a": range(1, 3)}
    info = store.channel_info("a")
    assert info is not None
    assert (info.first_seq, info.last_seq, info.msgs) == (3, 5, 3)
    assert [m.seq for m in store.read("a", 1, 10)] == [3, 4, 5], "reads skip what was evicted"
    assert store.get("a", 1) is None
    assert info.bytes == 3 * message_size(b"", b"1")


def test_a_batch_larger_than_max_msgs_keeps_the_newest(make_store: StoreMaker) -> None:
    store = make_store(StoreLimits(channel=ChannelLimits(max_msgs=2)))
    store.ensure_channel("a")
    result = store.append(msgs("a", *[b"x"] * 5))
    assert [s for s, _ in result.assigned] == [1, 2, 3, 4, 5]
    assert result.dropped == {"a": range(1, 4)}
    assert [m.seq for m in store.read("a", 1, 10)] == [4, 5]


def test_max_bytes_evicts_but_always_keeps_the_newest(make_store: StoreMaker) -> None:
    one = message_size(b"", b"x" * 100)
    store = make_store(StoreLimits(channel=ChannelLimits(max_bytes=2 * one + 10)))
    store.ensure_channel("a")
    store.append(msgs("a", b"x" * 100, b"x" * 100))
    assert store.append(msgs("a", b"x" * 100)).dropped == {"a": range(1, 2)}
    huge = store.append(msgs("a", b"y" * 10_000))
    assert huge.dropped == {"a": range(2, 4)}
    assert [m.seq for m in store.read("a", 1, 10)] == [4], "the newest stays even when it alone is too big"
    info = store.channel_info("a")
    assert info is not None
    assert info.bytes == message_size(b"", b"y" * 10_000)


def test_max_age_on_append_and_by_sweep(make_store: StoreMaker) -> None:
    store = make_store(StoreLimits(channel=ChannelLimits(max_age_s=10)))
    store.ensure_channel("a")
    store.ensure_channel("b")
    store.append(msgs("a", b"1"), now_unix_ns=100 * S)
    store.append(msgs("a", b"2") + msgs("b", b"x"), now_unix_ns=105 * S)
    assert store.append(msgs("a", b"3"), now_unix_ns=111 * S).dropped == {"a": range(1, 2)}
    assert store.expire(now_unix_ns=112 * S).dropped == {}
    swept = store.expire(now_unix_ns=115 * S)
    assert swept.dropped == {"a": range(2, 3), "b": range(1, 2)}
    assert swept.next_expiry_unix_ns == 121 * S
    everything = store.expire(now_unix_ns=200 * S)
    assert everything.dropped == {"a": range(3, 4)}
    assert everything.next_expiry_unix_ns is None
    info = store.channel_info("a")
    assert info is not None
    assert (info.first_seq, info.last_seq, info.msgs, info.bytes) == (4, 3, 0, 0), "all expired: first = last + 1"
    assert store.append(msgs("a", b"4"), now_unix_ns=201 * S).assigned[0][0] == 4, "sequences keep increasing"


def test_expire_without_age_limits_does_nothing(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    store.append(msgs("a", b"1"), now_unix_ns=1)
    result = store.expire(now_unix_ns=10**19)
    assert (result.dropped, result.next_expiry_unix_ns) == ({}, None)


def test_per_channel_limits_override_globals(make_store: StoreMaker) -> None:
    limits = StoreLimits(
        channel=ChannelLimits(max_msgs=2),
        per_channel={"keep.*": ChannelLimits(max_msgs=-1), "keep.few": ChannelLimits(max_msgs=1)},
    )
    store = make_store(limits)
    for name in ("plain", "keep.all", "keep.few"):
        store.ensure_channel(name)
        store.append(msgs(name, b"1", b"2", b"3", b"4"))
    counts = {c.name: c.msgs for c in store.channels()}
    assert counts == {"plain": 2, "keep.all": 4, "keep.few": 1}


# -- subscriptions, pending, clients -----------------------------------------------------------


def test_subscription_state_round_trip(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("foo")
    first, second = store.new_subscription_id(), store.new_subscription_id()
    assert first != second
    rich = sub_record(
        first,
        durable_name="dur",
        queue_group="grp",
        start_position=StartPosition.SEQUENCE_START,
        start_sequence=42,
        is_durable=True,
        options=SubOptions(max_deliver=5, dead_letter_channel="foo.dead", backoff_ms=(100, 1000)),
    )
    store.apply(
        [
            SaveSubscription(rich),
            SaveSubscription(sub_record(second)),
            SetPending(first, 1, 1),
            SetPending(first, 2, 1),
            SetPending(first, 2, 2),
            SetPending(first, 3, 1),
            ClearPending(first, 1),
            SetLastSent(first, 3),
        ]
    )
    recovered = {s.record.sub_id: s for s in store.recover().subscriptions}
    assert recovered[first].record == attrs.evolve(rich, last_sent=3)
    assert dict(recovered[first].pending) == {2: 2, 3: 1}, "attempt counts are kept"
    assert dict(recovered[second].pending) == {}
    store.apply([DeleteSubscription(first)])
    assert [s.record.sub_id for s in store.recover().subscriptions] == [second]


def test_a_nakd_entry_keeps_the_end_of_its_wait_until_written_again(make_store: StoreMaker) -> None:
    store = make_store()
    store.apply([SaveSubscription(sub_record(1)), SetPending(1, 2, 1), SetPending(1, 3, 2, not_before_ns=5 * 10**18)])
    if make_store.recoverable:
        store = make_store.reopen(store)
    (sub,) = store.recover().subscriptions
    assert (dict(sub.pending), dict(sub.naks)) == ({2: 1, 3: 2}, {3: 5 * 10**18})
    store.apply([SetPending(1, 3, 3)])  # sent again: no wait any more
    (sub,) = store.recover().subscriptions
    assert (dict(sub.pending), dict(sub.naks)) == ({2: 1, 3: 3}, {})


def test_last_sent_is_raised_to_the_highest_pending(make_store: StoreMaker) -> None:
    store = make_store()
    store.apply([SaveSubscription(sub_record(1, last_sent=2)), SetPending(1, 7, 1)])
    (sub,) = store.recover().subscriptions
    assert sub.record.last_sent == 7


def test_clients_register_and_unregister(make_store: StoreMaker) -> None:
    store = make_store()
    alice = ClientRecord("alice", "_INBOX.hb1", b"conn-1", 1, 5, 88)
    store.register_client(alice)
    store.register_client(ClientRecord("bob", "_INBOX.hb2"))
    store.register_client(ClientRecord("bob", "_INBOX.hb3", b"conn-2"))
    store.unregister_client("nobody")
    clients = {c.client_id: c for c in store.recover().clients}
    assert clients == {"alice": alice, "bob": ClientRecord("bob", "_INBOX.hb3", b"conn-2")}
    store.unregister_client("alice")
    assert [c.client_id for c in store.recover().clients] == ["bob"]


def test_recover_reports_server_and_channels(make_store: StoreMaker) -> None:
    store = make_store(cluster_id="prod")
    store.ensure_channel("foo")
    store.append(msgs("foo", b"1", b"2"))
    state = store.recover()
    assert state.server.cluster_id == "prod"
    assert [(c.name, c.last_seq) for c in state.channels] == [("foo", 2)]


def test_statistics_grow_with_data(make_store: StoreMaker) -> None:
    store = make_store()
    store.ensure_channel("a")
    before = store.statistics().messages_used_bytes
    store.append(msgs("a", *[b"x" * 1000] * 200))
    assert store.statistics().messages_used_bytes > before


# -- restart -------------------------------------------------------------------------------------


def test_everything_survives_a_restart(make_store: StoreMaker) -> None:
    need_restart(make_store)
    limits = StoreLimits(channel=ChannelLimits(max_msgs=3))
    store = make_store(limits)
    store.ensure_channel("foo")
    store.append(msgs("foo", b"1", b"2", b"3", b"4"), now_unix_ns=5 * S)
    store.register_client(ClientRecord("me", "_INBOX.hb", b"c1"))
    sub_id = store.new_subscription_id()
    store.apply(
        [SaveSubscription(sub_record(sub_id, is_durable=True)), SetPending(sub_id, 3, 4), SetLastSent(sub_id, 4)]
    )
    before = store.recover()
    store = make_store.reopen(store)
    after = store.recover()
    assert after == before
    assert [m.data for m in store.read("foo", 1, 10)] == [b"2", b"3", b"4"]
    assert store.new_subscription_id() > sub_id, "ids are never reused after a restart"
    assert store.append(msgs("foo", b"5"), now_unix_ns=1).assigned == [(5, 5 * S)]
    assert store.channel_info("foo") is not None


def test_subscription_ids_are_not_reused_after_deleting_the_newest(make_store: StoreMaker) -> None:
    need_restart(make_store)
    store = make_store()
    ids = [store.new_subscription_id() for _ in range(3)]
    store.apply([SaveSubscription(sub_record(i)) for i in ids])
    store.apply([DeleteSubscription(ids[-1])])
    store = make_store.reopen(store)
    assert store.new_subscription_id() > ids[-1]
