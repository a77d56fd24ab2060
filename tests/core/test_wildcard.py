"""Wildcard subscriptions at the engine level: one subscription over every channel a pattern matches,
now and later, each channel in its own order with its own position; MaxInflight across the channels
and shared fairly; AckWait, naks and MaxDeliver per message; start positions per channel; durables
that remember a position per channel across a close and a restart (over real LMDB files); channels
the user may not read left out; MaxInactivity still deleting idle channels. Time is virtual."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import ChannelLimits, LmdbStore, StartPosition, StoreLimits, SubOptions
from streaming.core.engine import Reason, RequestError
from streaming.core.errors import ChannelBeingDeleted
from tests.core.harness import Harness

NEW, RESTART = Reason.NEW, Reason.RESTART


def test_it_follows_every_matching_channel_now_and_later_each_in_its_own_order() -> None:
    h = Harness()
    h.client()
    h.publish("orders.eu", count=2)
    h.publish("orders.eu.archive", count=1)
    sub = h.subscribe("orders.*", start=StartPosition.FIRST)
    assert h.wild_seqs(sub) == [("orders.eu", 1), ("orders.eu", 2)], "`*` is one token: not orders.eu.archive"
    h.publish("orders.us", count=2)  # a channel made after the subscription: all of it is new to it
    h.publish("orders.eu", count=1)
    h.publish("invoices.eu", count=1)
    assert h.wild_seqs(sub) == [("orders.us", 1), ("orders.us", 2), ("orders.eu", 3)]
    deep = h.subscribe("orders.>", start=StartPosition.FIRST)
    assert sorted(h.wild_seqs(deep)) == [
        ("orders.eu", 1),
        ("orders.eu", 2),
        ("orders.eu", 3),
        ("orders.eu.archive", 1),
        ("orders.us", 1),
        ("orders.us", 2),
    ]


def test_start_positions_apply_per_channel() -> None:
    h = Harness()
    h.client()
    h.publish("a.x", count=3)
    h.publish("a.y", count=2)
    new_only = h.subscribe("a.*")
    last = h.subscribe("a.*", start=StartPosition.LAST_RECEIVED)
    from_seq = h.subscribe("a.*", start=StartPosition.SEQUENCE_START, start_sequence=2)
    assert h.wild_seqs(new_only) == []
    assert sorted(h.wild_seqs(last)) == [("a.x", 3), ("a.y", 2)]
    assert sorted(h.wild_seqs(from_seq)) == [("a.x", 2), ("a.x", 3), ("a.y", 2)]
    h.publish("a.y", count=1)
    assert h.wild_seqs(new_only) == [("a.y", 3)]


def test_acks_name_the_channel_and_redelivery_is_per_message() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe("a.*", ack_wait_s=5)
    h.publish("a.x", count=2)
    h.publish("a.y", count=2)
    h.take_wild(sub)
    assert h.ack_on(sub, "a.x", 1, 2) == [True, True]
    assert h.ack_on(sub, "a.y", 2) == [True]
    assert h.ack_on(sub, "a.z", 1) == [False], "a channel it does not follow"
    assert h.ack_on(sub, "a.y", 7) == [False]
    h.advance(5)
    assert h.take_wild(sub) == [("a.y", 1, 2, Reason.ACK_TIMEOUT)]
    part = h.engine.part_for(sub, "a.y")
    assert part is not None and h.nak(part, 1, 2.0)
    h.advance(1.9)
    assert h.take_wild(sub) == []
    h.advance(0.1)
    assert h.take_wild(sub) == [("a.y", 1, 3, Reason.NAK)]


def test_max_inflight_counts_across_channels_and_a_busy_channel_does_not_starve_the_others() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe("a.*", max_inflight=2)
    h.publish("a.busy", count=50)
    assert h.wild_seqs(sub) == [("a.busy", 1), ("a.busy", 2)]
    h.publish("a.quiet", count=1)
    assert h.wild_seqs(sub) == [], "no room"
    h.ack_on(sub, "a.busy", 1)
    h.ack_on(sub, "a.busy", 2)
    got = h.wild_seqs(sub)
    assert ("a.quiet", 1) in got and len(got) == 2, f"the quiet channel takes its turn: {got}"
    pending = h.engine.wildcard(sub)
    assert pending is not None and pending.count == 2


def test_max_inflight_is_shared_in_turn_when_room_comes_one_ack_at_a_time() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe("a.*", max_inflight=1)
    h.publish("a.one", count=5)
    h.publish("a.two", count=5)
    order = []
    for _ in range(10):
        ((channel, seq),) = h.wild_seqs(sub)
        order.append(channel)
        h.ack_on(sub, channel, seq)
    # a.one went first and kept its place in line while its message was acked; then they alternate
    # until a.one has no more.
    assert order == ["a.one", "a.one", "a.two", "a.one", "a.two", "a.one", "a.two", "a.one", "a.two", "a.two"]


def test_max_deliver_and_dead_letters_per_channel() -> None:
    h = Harness()
    h.client()
    dead = h.subscribe("a.x.dead")
    sub = h.subscribe("a.*", ack_wait_s=1, options=SubOptions(max_deliver=2))
    h.publish("a.x", b"poison")
    h.advance(1)
    assert h.take_wild(sub) == [("a.x", 1, 1, NEW), ("a.x", 1, 2, Reason.ACK_TIMEOUT)]
    h.advance(1)
    assert h.seqs(dead) == [1], "dead-lettered to the channel's own dead-letter channel"
    assert h.take_wild(sub) == []


def test_a_durable_keeps_each_channels_position_while_away_and_follows_channels_made_meanwhile() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe("a.*", durable="d")
    h.publish("a.x", count=2)
    h.take_wild(sub)
    h.ack_on(sub, "a.x", 1)
    h.engine.close_subscription(sub, h.now)
    h.publish("a.x", count=1)
    h.publish("a.y", count=2)
    assert h.take_wild(sub) == []
    again = h.subscribe("a.*", durable="d")
    assert again == sub
    got = h.take_wild(sub)
    assert got[0] == ("a.x", 2, 2, Reason.RESUME), "what was pending goes first"
    assert sorted((c, s) for c, s, _, _ in got[1:]) == [("a.x", 3), ("a.y", 1), ("a.y", 2)]
    with pytest.raises(RequestError, match="duplicate durable"):
        h.subscribe("a.*", durable="d")


def test_unsubscribing_ends_every_part() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe("a.*", durable="d")
    h.publish("a.x", count=1)
    h.publish("a.y", count=1)
    h.engine.unsubscribe(sub, h.now)
    h.collect()
    assert h.engine.wildcard(sub) is None and not h.engine.has_subscription(sub)
    assert h.store.recover().subscriptions == [], "nothing of it stays in the store"
    h.publish("a.z", count=1)
    assert h.engine.subscriptions() == []


def test_channels_it_may_not_read_are_left_out() -> None:
    h = Harness()
    h.client()
    h.publish("a.secret", count=1)
    sub = h.subscribe("a.*", start=StartPosition.FIRST, exclude=("a.secret",))
    h.publish("a.public", count=1)
    h.publish("a.secret", count=1)
    assert h.wild_seqs(sub) == [("a.public", 1)]
    assert h.engine.part_for(sub, "a.secret") is None


def test_a_queue_group_on_a_wildcard_shares_each_channel_among_its_members() -> None:
    h = Harness()
    h.client("c1")
    h.client("c2")
    h.publish("a.x", count=1)
    one = h.subscribe("a.*", "c1", queue="g", start=StartPosition.FIRST)
    two = h.subscribe("a.*", "c2", queue="g", start=StartPosition.LAST_RECEIVED)  # joins: the group's place
    h.publish("a.x", count=3)
    h.publish("a.y", count=4)
    got = sorted(h.wild_seqs(one) + h.wild_seqs(two))
    assert got == [("a.x", s) for s in range(1, 5)] + [("a.y", s) for s in range(1, 5)], "each message once"
    wild = h.engine.wildcard(one)
    assert wild is not None
    held = {c: sorted(h.engine.inspect.pending(p.record.sub_id)) for c, p in wild.parts.items()}
    h.drop_client("c1")  # its messages go to the other member
    assert sorted(h.wild_seqs(two)) == sorted((c, s) for c, seqs in held.items() for s in seqs)


def test_an_ordered_group_sends_each_channel_one_message_at_a_time_and_spreads_the_channels() -> None:
    h = Harness()
    for c in ("c1", "c2"):
        h.client(c)
    members = [h.subscribe("a.*", c, queue="g", options=SubOptions(ordered=True)) for c in ("c1", "c2")]
    h.publish("a.x", count=3)
    h.publish("a.y", count=3)
    first = {m: h.wild_seqs(m) for m in members}
    assert sorted(m for got in first.values() for m in got) == [("a.x", 1), ("a.y", 1)], "one of each channel"
    assert all(len(got) == 1 for got in first.values()), f"the channels spread over the members: {first}"
    owner = next(m for m, got in first.items() if got == [("a.x", 1)])
    h.ack_on(owner, "a.x", 1)
    after = {m: h.wild_seqs(m) for m in members}
    assert [m for got in after.values() for m in got] == [("a.x", 2)], "the next of a.x only once 1 is acked"
    with pytest.raises(RequestError, match="order"):
        h.subscribe("a.*", "c1", queue="g")  # a member that would not keep the order


def test_an_ordered_group_redelivers_after_ackwait_before_the_next_of_the_channel() -> None:
    h = Harness()
    h.client()
    sub = h.subscribe("q", queue="g", ack_wait_s=2, options=SubOptions(ordered=True))
    h.publish("q", count=2)
    assert h.take(sub) == [(1, 1, NEW)]
    h.advance(2)
    assert h.take(sub) == [(1, 2, Reason.ACK_TIMEOUT)], "a plain channel's ordered group too"
    h.ack(sub, 1)
    assert h.take(sub) == [(2, 1, NEW)]


def test_max_inactivity_still_deletes_channels_a_wildcard_follows_once_nothing_is_pending() -> None:
    h = Harness(limits=StoreLimits(channel=ChannelLimits(max_inactivity_s=10)))
    h.client()
    sub = h.subscribe("a.*")
    h.publish("a.x", count=1)
    h.publish("a.y", count=1)
    h.take_wild(sub)
    h.ack_on(sub, "a.x", 1)
    h.advance(11)
    h.take_wild(sub)
    assert h.engine.inactive_channels(h.now) == ["a.x"], "a.y still has a message pending"
    h.store.delete_channel("a.x")
    h.pipeline.channel_deleted("a.x")
    assert h.engine.part_for(sub, "a.x") is None
    h.publish("a.x", count=1)  # made again: followed again, from its first message
    assert h.wild_seqs(sub) == [("a.x", 1)]


def test_a_restart_over_lmdb_keeps_each_channels_position_and_sends_pending_first(tmp_path: Path) -> None:
    h = Harness(LmdbStore(tmp_path))
    h.client()
    h.client("gone")
    durable = h.subscribe("a.*", durable="d", ack_wait_s=30)
    plain = h.subscribe("a.>", ack_wait_s=30)
    h.subscribe("a.*", client="gone")
    h.publish("a.x", count=2)
    h.publish("a.y", count=1)
    h.take_wild(durable)
    h.take_wild(plain)
    h.ack_on(durable, "a.x", 1)
    h.ack_on(plain, "a.x", 1, 2)
    h.drop_client("gone")
    h.collect()
    h.store.close()
    h.restart(LmdbStore(tmp_path))

    assert sorted(h.take_wild(durable)) == [("a.x", 2, 2, RESTART), ("a.y", 1, 2, RESTART)]
    assert h.take_wild(plain) == [("a.y", 1, 2, RESTART)]
    h.publish("a.x", count=1)
    h.publish("a.z", count=1)
    assert sorted(h.wild_seqs(durable)) == [("a.x", 3), ("a.z", 1)]
    assert sorted(h.wild_seqs(plain)) == [("a.x", 3), ("a.z", 1)]
    records = h.store.recover().subscriptions
    assert len({r.record.sub_id for r in records}) == len(records)
    wildcards = sorted(r.record.channel for r in records if not r.record.parent_id)
    assert wildcards == ["a.*", "a.>"], "the departed client's wildcard is gone, parts and all"
    h.store.close()


def test_an_empty_durable_wildcard_group_keeps_every_channel_across_a_restart(tmp_path: Path) -> None:
    h = Harness(LmdbStore(tmp_path))
    for c in ("c1", "c2", "c3"):
        h.client(c)
    one = h.subscribe("a.*", "c1", durable="dg", queue="g", ack_wait_s=30)
    two = h.subscribe("a.*", "c2", durable="dg", queue="g", ack_wait_s=30)
    h.publish("a.x", count=2)
    h.publish("a.y", count=2)
    got = h.wild_seqs(one) + h.wild_seqs(two)
    assert sorted(got) == [("a.x", 1), ("a.x", 2), ("a.y", 1), ("a.y", 2)]
    assert h.ack_on(one, "a.x", 1) == [True], "any member may ack a message of the group, as on a channel"
    h.drop_client("c2")  # a member leaves: what it held goes to the other
    h.drop_client("c1")  # the last one: the group keeps its state
    h.publish("a.x", count=1)
    h.publish("a.z", count=1)  # a channel made while the group is empty
    h.collect()
    h.store.close()
    h.restart(LmdbStore(tmp_path))

    back = h.subscribe("a.*", "c3", durable="dg", queue="g", ack_wait_s=30)
    sent = h.take_wild(back)
    redelivered = sorted((c, s) for c, s, _, reason in sent if reason is not NEW)
    assert redelivered == [("a.x", 2), ("a.y", 1), ("a.y", 2)], "every unacked message, none twice"
    assert sorted((c, s) for c, s, _, reason in sent if reason is NEW) == [("a.x", 3), ("a.z", 1)]
    h.store.close()


def test_a_pattern_matching_a_channel_being_deleted_is_refused_for_that_moment() -> None:
    h = Harness()
    h.client()
    h.publish("a.x", count=1)
    with h.pipeline.deleting("a.x"), pytest.raises(ChannelBeingDeleted):
        h.subscribe("a.*")
    with h.pipeline.deleting("b.x"):
        h.subscribe("a.*")  # another family: taken
