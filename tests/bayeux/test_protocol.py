"""The sans-IO Bayeux layer with no HTTP: the channel mapping, message checks on arbitrary input, and
the ack extension's batches as a Hypothesis state machine (a client that loses replies, and one that
acknowledges anything at all)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streaming.bayeux import channels
from streaming.bayeux import protocol as bx
from streaming.core.outbound import MAX_NAK_DELAY_S, Message
from streaming.stan.requests import valid_channel

_ALPHABET = "abcXYZ019 !#$()*+-.@_{}~"
segment = st.text(alphabet=_ALPHABET, min_size=1, max_size=8).filter(lambda s: s not in ("*", "**"))
concrete = st.lists(segment, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))


@given(concrete)
def test_a_concrete_channel_maps_to_a_valid_engine_channel_and_back(channel: str) -> None:
    assert channels.valid(channel) and channels.mappable(channel)
    name = channels.to_engine(channel)
    assert valid_channel(name), name
    assert channels.from_engine(name) == channel


@given(concrete, concrete)
def test_the_mapping_is_injective(a: str, b: str) -> None:
    if a != b:
        assert channels.to_engine(a) != channels.to_engine(b)


def test_plain_names_map_as_users_would_guess() -> None:
    assert channels.to_engine("/orders/eu") == "orders.eu"
    assert channels.from_engine("orders.eu") == "/orders/eu"
    assert channels.to_engine("/a.b/c d") == "a~2Eb.c~20d"
    for bad in ("/", "orders", "/a//b", "/a/", "/é", 5, None):
        assert not (channels.valid(bad) and channels.mappable(str(bad)))
    assert channels.is_wildcard("/chat/*") and channels.is_wildcard("/chat/**")


@given(st.binary(max_size=200))
def test_any_body_is_messages_or_a_clear_error(body: bytes) -> None:
    try:
        messages = bx.parse_body(body)
    except bx.BadBody as exc:
        assert str(exc)
    else:
        assert isinstance(messages, list) and messages


def test_numbers_constants_and_nesting_that_are_not_json_to_us_are_refused_with_the_body() -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    bodies = (b'{"channel":"/a","data":NaN}', b"[Infinity]", b"[-Infinity]", b"[1e999]", b'{"data":[-2E400]}', nested)
    for body in bodies:
        with pytest.raises(bx.BadBody, match="not JSON"):
            bx.parse_body(body)
    assert bx.parse_body(b'[{"data":[1e308,-2.5e-300,0.1]}]') == [{"data": [1e308, -2.5e-300, 0.1]}]


# Any code point, lone UTF-16 surrogates included: JSON's "\ud800" escape parses to one, and
# JavaScript strings (what CometD clients publish) hold them.
surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=())
any_text = st.text(st.characters(codec=None, exclude_categories=()) | surrogates, max_size=6)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | any_text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
        max_leaves=8,
    )
)
def test_any_parsed_value_is_stored_as_json_that_reads_back_the_same(value: Any) -> None:
    # As a client sends it (JSON.stringify escapes lone surrogates), then as the door parses it.
    (message,) = bx.parse_body(json.dumps([{"channel": "/a", "data": value}]).encode())
    stored = bx.encode_data(message["data"])
    stored.decode()  # UTF-8
    assert json.loads(stored) == message["data"]


def test_a_lone_surrogate_is_stored_as_its_escape_and_delivered_as_json() -> None:
    (message,) = bx.parse_body(b'[{"channel":"/a","data":{"s":"\\ud800x\\u00e9"}}]')
    stored = bx.encode_data(message["data"])
    assert stored == b'{"s":"\\ud800x\\u00e9"}'
    delivered = json.loads(bx.delivery(b'"/a"', 1, 1, 0, stored))
    assert delivered["data"] == {"s": "\ud800x\u00e9"} and "encoding" not in delivered["ext"]
    answer = bx.encode_answer([bx.error({"channel": "/\udc00"}, bx.CHANNEL_INVALID)])
    assert json.loads(answer) == [{"channel": "/\udc00", "successful": False, "error": bx.CHANNEL_INVALID}]


json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
message_like = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "channel": st.sampled_from(["/meta/connect", "/a/b", "", "x"]) | json_values,
        "clientId": json_values,
        "subscription": json_values,
        "ext": json_values,
        "advice": json_values,
    },
)


@given(st.one_of(json_values, message_like))
def test_any_json_message_is_checked_without_raising(message: Any) -> None:
    bad = bx.check(message)
    if bad is not None:
        assert bad["successful"] is False and bad["error"]
        json.dumps(bad)
        return
    assert isinstance(message, dict) and channels.valid(message["channel"])
    names = bx.subscriptions_of(message)
    if isinstance(names, dict):
        assert names["successful"] is False
    bx.client_wants_now(message)
    bx.wants_ack(message)
    bx.session_unknown(message)


# Nesting within every parser's limit, and past them all (JSON.parse takes thousands of levels; the
# standard library's check here and orjson's, about a thousand).
deep = (st.integers(1, 500) | st.integers(2000, 5000)).map(lambda n: b"[" * n + b"]" * n)


@given(
    st.one_of(st.binary(max_size=50), json_values.map(bx.encode_data), st.sampled_from([b"NaN", b"[Infinity]"]), deep)
)
def test_stored_bytes_always_reach_bayeux_as_valid_json(raw: bytes) -> None:
    encoded = bx.delivery(b'"/a"', 1, 2, 5, raw)
    message = json.loads(encoded, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert message["channel"] == "/a" and message["id"] == "1x2" and message["ext"]["seq"] == 2
    how = message["ext"].get("encoding", "json")
    if how == "json":
        assert message["data"] == json.loads(raw)
    elif how == "text":
        assert message["data"] == raw.decode()
    else:
        assert base64.b64decode(message["data"]) == raw


def test_an_answer_is_one_json_array_of_replies_and_deliveries() -> None:
    body = bx.encode_answer([bx.delivery(b'"/a"', 1, 1, 0, b'{"n":1}'), {"channel": "/meta/connect"}])
    assert json.loads(body) == [
        {"channel": "/a", "data": {"n": 1}, "id": "1x1", "ext": {"seq": 1, "timestamp": 0}},
        {"channel": "/meta/connect"},
    ]


class AckedDelivery(RuleBasedStateMachine):
    """One ack-enabled session and a client that behaves as the JS AckExtension does (it sends the last
    batch number it received), with replies that get lost on the way, and now and then an ack that
    no real client would send.

    Invariants: the queue keeps the order messages were queued in; nothing leaves the queue before a
    reply carried it; the client sees every message exactly once and in order as long as it only
    ever acknowledges what it received.
    """

    def __init__(self) -> None:
        super().__init__()
        self.session = bx.Session("c", ack_enabled=True, expires_at=0.0)
        self.queued: list[int] = []  # every message ever queued, in order
        self.sent_once: set[int] = set()  # carried by some reply
        self.removed: list[int] = []  # left the queue (acknowledged to the engine)
        self.seen: list[int] = []  # what the client application saw
        self.client_batch = 0  # the last batch number the client received
        self.honest = True

    @rule(count=st.integers(min_value=1, max_value=3))
    def queue(self, count: int) -> None:
        start = len(self.queued)
        for seq in range(start + 1, start + count + 1):
            self.session.queue(1, b'"/c"', stored(seq, 0, b"{}"))
            self.queued.append(seq)

    def _round_trip(self, ack: object, *, lost: bool) -> None:
        self.removed.extend(e.seq for e in self.session.acknowledge(ack))
        batch, entries, _ = self.session.close_batch()
        assert batch is not None and batch > self.client_batch
        self.sent_once.update(e.seq for e in entries)
        if not lost:
            # The client has not seen what it acknowledged (the JS client dedups nothing): a message
            # seen before would show up as a duplicate here.
            self.seen.extend(e.seq for e in entries)
            self.client_batch = batch

    @rule()
    def connect(self) -> None:
        self._round_trip(self.client_batch, lost=False)

    @rule()
    def connect_reply_lost(self) -> None:
        self._round_trip(self.client_batch, lost=True)
        # The client never saw those messages; what it saw stays as it was.

    @precondition(lambda self: self.session.next_batch > 1)
    @rule(ack=st.one_of(st.integers(min_value=-5, max_value=1000), st.none(), st.text(max_size=2), st.booleans()))
    def connect_with_any_ack(self, ack: object) -> None:
        self.honest = False
        self._round_trip(ack, lost=False)

    @invariant()
    def queue_keeps_the_order_of_queueing(self) -> None:
        seqs = [e.seq for e in self.session.unacked]
        assert seqs == sorted(seqs)
        assert self.removed + seqs == self.queued, "the queue lost or reordered messages"

    @invariant()
    def nothing_leaves_the_queue_unsent(self) -> None:
        assert set(self.removed) <= self.sent_once

    @invariant()
    def tags_never_decrease(self) -> None:
        tags = [e.tag for e in self.session.unacked]
        assert tags == sorted(tags)

    @invariant()
    def an_honest_client_sees_each_message_once_in_order(self) -> None:
        if self.honest:
            assert self.seen == self.queued[: len(self.seen)], "a gap, duplicate or reordering"


TestAckedDelivery = AckedDelivery.TestCase


def stored(seq: int, timestamp_unix_ns: int, data: bytes) -> Message:
    """A stored message of channel `/c`, as the engine hands deliveries over."""
    return Message(seq, timestamp_unix_ns, "c", "", data)


def test_a_session_without_acks_hands_over_what_it_sends() -> None:
    session = bx.Session("c", ack_enabled=False, expires_at=0.0)
    session.queue(1, b'"/c"', stored(1, 0, b"{}"))
    session.queue(1, b'"/c"', stored(2, 0, b"{}"))
    assert session.acknowledge(5) == []
    batch, entries, resent = session.close_batch()
    assert batch is None and [e.seq for e in entries] == [1, 2] and resent == 0
    assert not session.has_to_send()


def test_integers_beyond_64_bits_are_kept_exactly() -> None:
    # A faster parser that read them as doubles would change what subscribers get.
    big = 2**70 + 1
    (message,) = bx.parse_body(b'[{"channel": "/n", "data": %d}]' % big)
    assert message["data"] == big and isinstance(message["data"], int)
    assert bx.encode_data(message["data"]) == str(big).encode()


any_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=10,
)


nak_items = st.one_of(any_json, st.fixed_dictionaries({"id": any_text, "delay": any_json}))


@given(st.one_of(any_json, st.lists(nak_items)))
def test_any_ext_nak_is_naks_or_nothing_taken(given_back: Any) -> None:
    naks = bx.naks_of({"channel": "/meta/connect", "ext": {"nak": given_back}})
    assert (naks is None) == (given_back is None)  # null is no ext.nak at all
    for sub_id, seq, delay in naks or []:
        assert sub_id >= 0 and seq >= 0 and 0 <= delay <= MAX_NAK_DELAY_S


def test_ext_nak_takes_ids_and_objects_and_leaves_out_the_rest() -> None:
    given = ["3x7", {"id": "3x8", "delay": 2.5}, {"id": "3x9", "delay": -1}, {"id": "3x9", "delay": True}, "x", 5]
    assert bx.naks_of({"ext": {"nak": given}}) == [(3, 7, 0.0), (3, 8, 2.5)]
    assert bx.naks_of({"ext": {"ack": 1}}) is None and bx.naks_of({}) is None
    assert bx.naks_of({"ext": {"nak": "3x7"}}) == [], "not a list: nothing taken, and the reply says 0"


def test_a_message_two_subscriptions_match_reaches_the_session_once_and_both_are_settled() -> None:
    session = bx.Session("c", ack_enabled=True, expires_at=0.0)
    session.overlapping = True  # it has a wildcard subscription
    ch = b'"/chat/a"'
    m5, m6 = stored(5, 50, b"5"), stored(6, 60, b"6")
    assert session.queue_run(1, ch, [m5, m6]) == 2  # `/chat/*`
    assert session.queue_run(2, ch, [m5, m6]) == 0  # `/chat/**`: they ride on the first
    assert session.queue_run(2, ch, [m5]) == 0, "a redelivered copy does not ride twice"
    batch, entries, _ = session.close_batch()
    assert [e.message for e in entries] == [bx.delivery(ch, 1, 5, 50, b"5"), bx.delivery(ch, 1, 6, 60, b"6")]
    gave = session.give_back([(1, 6, 3.0)])
    assert sorted(gave) == [(1, 6, 3.0), (2, 6, 3.0)], "a nak gives back the copies riding on it"
    acked = session.acknowledge(batch)
    assert sorted((e.sub_id, e.seq) for e in acked) == [(1, 5), (2, 5)]
    assert session.queue_run(2, ch, [m6]) == 1, "once settled, a copy is queued again"

    plain = bx.Session("p", ack_enabled=False, expires_at=0.0)
    plain.overlapping = True
    m1 = stored(1, 10, b"1")
    plain.queue_run(1, ch, [m1])
    plain.queue_run(2, ch, [m1])
    _, out, _ = plain.close_batch()
    assert sorted((e.sub_id, e.seq) for e in out) == [(1, 1), (2, 1)]
    assert [e.message for e in out if e.message] == [bx.delivery(ch, 1, 1, 10, b"1")], "written once, for both"


def test_a_queued_delivery_is_written_when_a_reply_first_carries_it_and_then_kept() -> None:
    session = bx.Session("c", ack_enabled=True, expires_at=0.0)
    session.queue_run(3, b'"/c"', [stored(7, 70, b'{"a":1}'), stored(8, 80, b"\xff")])
    _, entries, _ = session.close_batch()
    first = [e.message for e in entries]
    assert [json.loads(m) for m in first] == [
        {"channel": "/c", "data": {"a": 1}, "id": "3x7", "ext": {"seq": 7, "timestamp": 70}},
        {"channel": "/c", "data": "/w==", "id": "3x8", "ext": {"seq": 8, "timestamp": 80, "encoding": "base64"}},
    ]
    _, again, resent = session.close_batch()  # not acknowledged: it goes again, the same bytes
    assert resent == 2 and [e.message for e in again] == first


def test_wildcard_channels_map_to_engine_patterns() -> None:
    assert channels.pattern_to_engine("/chat/*") == "chat.*"
    assert channels.pattern_to_engine("/chat/**") == "chat.>"
    assert channels.pattern_to_engine("/**") == ">"
    assert channels.pattern_to_engine("/a.b/*") == "a~2Eb.*", "a segment's dot is escaped, never a token break"
    assert channels.pattern_to_engine("/a//*") is None and channels.pattern_to_engine("/a/*/b") is None
