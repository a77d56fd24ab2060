"""Both parsers take any bytes, split anywhere: the NATS core parser (either side) and the STAN request
decoding. Bad input is the peer's protocol error, never another exception, never a hang."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.stan.requests import (
    InvalidRequest,
    parse_close,
    parse_connect,
    parse_publish,
    parse_subscribe,
    parse_unsubscribe,
)
from streaming.wire import nats as p
from streaming.wire.stan_pb import protocol_pb2 as pb

# Raw bytes, and bytes that look like the protocol (real verbs, CRLFs, sizes) so the parser gets past
# its first line more often than random bytes would let it.
TOKENS = [b"PUB ", b"SUB ", b"UNSUB ", b"MSG ", b"CONNECT ", b"INFO ", b"PING", b"PONG", b"+OK", b"-ERR ", b"HPUB "]
TOKENS += [b"\r\n", b" ", b"foo", b"foo.bar", b"_INBOX.x", b"1", b"5", b"12", b"-1", b"99999999999", b"{}", b"hello"]
protocolish = st.lists(st.one_of(st.sampled_from(TOKENS), st.binary(max_size=8)), max_size=40).map(b"".join)
inputs = st.one_of(st.binary(max_size=400), protocolish)


def parse_all(conn: p.ServerConnection | p.ClientConnection, data: bytes, cuts: list[int]) -> None:
    """Feed `data` in the pieces `cuts` makes, taking every event after each; a bounded number of
    events per piece proves that no input makes the parser spin."""
    bounds = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    for start, end in itertools.pairwise(bounds):
        conn.receive_data(data[start:end])
        for _ in range(len(data) + 2):
            if conn.next_event() is p.NEED_DATA:
                break
        else:
            raise AssertionError("the parser kept producing events without input")


@pytest.mark.parametrize("side", [p.ServerConnection, p.ClientConnection])
@settings(max_examples=300, deadline=None)
@given(data=inputs, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_nats_parser_takes_any_bytes_split_anywhere(
    side: Callable[[], p.ServerConnection | p.ClientConnection], data: bytes, cuts: list[int]
) -> None:
    conn = side()
    with contextlib.suppress(p.RemoteProtocolError):  # the peer broke the rules: -ERR, and it is closed
        parse_all(conn, data, cuts)


PARSERS: list[Callable[[bytes], object]] = [
    parse_connect,
    parse_publish,
    lambda payload: parse_subscribe(payload, "_STAN.ack.x"),
    lambda payload: parse_subscribe(payload, "_STAN.ack.x", ms_mode=True),
    parse_unsubscribe,
    parse_close,
]
# Valid messages of every request type, so that mutations of them reach the field checks.
VALID = [
    pb.ConnectRequest(clientID="me", heartbeatInbox="_HB.me").SerializeToString(),
    pb.PubMsg(clientID="me", guid="g", subject="foo", data=b"x").SerializeToString(),
    pb.SubscriptionRequest(
        clientID="me", subject="foo", inbox="_INBOX.1", maxInFlight=1, ackWaitInSecs=1
    ).SerializeToString(),
    pb.UnsubscribeRequest(clientID="me", subject="foo", inbox="_STAN.ack.x").SerializeToString(),
    pb.CloseRequest(clientID="me").SerializeToString(),
]
mutated = st.tuples(st.sampled_from(VALID), st.integers(0, 200), st.binary(max_size=6)).map(
    lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + len(t[2]) :]
)


@pytest.mark.parametrize("parse", PARSERS)
@settings(max_examples=300, deadline=None)
@given(payload=st.one_of(st.binary(max_size=200), mutated))
def test_stan_requests_take_any_bytes(parse: Callable[[bytes], object], payload: bytes) -> None:
    try:
        parse(payload)
    except InvalidRequest as exc:
        assert str(exc), "a refusal names the problem"


class _ServerGeneralPathOnly(p.ServerConnection):
    """The server-side parser without its fast path for PUB: what every input must parse to."""

    def _fast_message(self, buf: bytearray, pos: int) -> tuple[p.Event, int] | None:
        return None


class _ClientGeneralPathOnly(p.ClientConnection):
    """The client-side parser without its fast path for MSG."""

    def _fast_message(self, buf: bytearray, pos: int) -> tuple[p.Event, int] | None:
        return None


def _outcome(
    conn: p.ServerConnection | p.ClientConnection, data: bytes, cuts: list[int], runs: int | None = None
) -> tuple[list[object], str | None]:
    """The events `data` parses to, fed in pieces cut at `cuts`, and the error that ended it. With
    `runs`, after each message the run of identical ones after it is taken (at most `runs` at a
    time), as a bus does."""
    events: list[object] = []
    bounds = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    try:
        for start, end in itertools.pairwise(bounds):
            conn.receive_data(data[start:end])
            while (event := conn.next_event()) is not p.NEED_DATA:
                events.append(event)
                if runs is not None and isinstance(event, p.Pub | p.Msg):
                    events += [attrs.evolve(event, payload=payload) for payload in conn.repeats(runs)]
    except p.RemoteProtocolError as exc:
        return events, str(exc)
    return events, None


PUBLISHISH = [b"PUB ", b"PUB  ", b"pub ", b"MSG ", b"\r\n", b"\n", b"\r", b" ", b"\t", b"foo", b"_INBOX.x", b"0"]
PUBLISHISH += [b"3", b"12", b"99999999", b"+1", b"1_0", b"\xff", b"\xc3\xa9", b"hey"]
publishish = st.lists(st.one_of(st.sampled_from(PUBLISHISH), st.binary(max_size=4)), max_size=30).map(b"".join)


@st.composite
def message_frames(draw: st.DrawFn, verb: bytes, fields: int) -> bytes:
    """Messages as peers write them (PUB from clients, MSG from the server), and near misses: a wrong
    size, other spacing, a lone LF, bytes that are not UTF-8, payloads past the limit, a field
    missing or one too many."""
    frames = []
    names = st.sampled_from([b"f", b"ab", b"foo", b"a.b", b"\xc3\xa9", b"\xff", b"x\ty"])
    for _ in range(draw(st.integers(1, 4))):
        header = [draw(names) for _ in range(fields + draw(st.sampled_from([0, 0, -1, 1])))]
        reply = draw(st.sampled_from([b"", b"_INBOX.1"]))
        payload = draw(st.binary(max_size=14))
        size = str(len(payload) + draw(st.sampled_from([0, 0, 0, 1, -1]))).encode()
        sep = draw(st.sampled_from([b" ", b" ", b"  ", b"\t"]))
        line = verb + sep.join([*header, *([reply] if reply else []), size])
        frames.append(line + draw(st.sampled_from([b"\r\n", b"\r\n", b"\n"])) + payload + b"\r\n")
    return b"".join(frames)


SIDES = [
    (p.ServerConnection, _ServerGeneralPathOnly, message_frames(b"PUB ", 1)),
    (p.ClientConnection, _ClientGeneralPathOnly, message_frames(b"MSG ", 2)),
]


@pytest.mark.parametrize(("fast_side", "general_side", "frames"), SIDES)
@settings(max_examples=500, deadline=None)
@given(
    data=st.data(),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=4),
    max_control_line=st.sampled_from([8, 9, 10, 11, 12, 16, 4096, 4096, 4096, 4096]),
)
def test_the_fast_path_for_messages_parses_as_the_general_path(
    fast_side: Callable[..., p.ServerConnection | p.ClientConnection],
    general_side: Callable[..., p.ServerConnection | p.ClientConnection],
    frames: st.SearchStrategy[bytes],
    data: st.DataObject,
    cuts: list[int],
    max_control_line: int,
) -> None:
    raw = data.draw(st.one_of(inputs, publishish, frames))
    fast = fast_side(max_payload=10, max_control_line=max_control_line)
    general = general_side(max_payload=10, max_control_line=max_control_line)
    assert _outcome(fast, raw, cuts) == _outcome(general, raw, cuts)


@pytest.mark.parametrize(("fast_side", "general_side", "frames"), SIDES)
@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    times=st.integers(1, 6),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=4),
    limit=st.integers(0, 4),
)
def test_runs_of_repeated_messages_parse_as_one_by_one(
    fast_side: Callable[..., p.ServerConnection | p.ClientConnection],
    general_side: Callable[..., p.ServerConnection | p.ClientConnection],
    frames: st.SearchStrategy[bytes],
    data: st.DataObject,
    times: int,
    cuts: list[int],
    limit: int,
) -> None:
    """A burst of acks or publishes repeats one control line: taken as a run (at most `limit` at a
    time), it is the same messages, in order, and what follows parses as it would have."""
    frame = data.draw(frames)
    spoilt = st.sampled_from([frame[:-2] + b"??", frame[:-2] + b"\n", frame[:-1], frame[:-2]])  # its end, not CRLF
    raw = frame * times + data.draw(st.one_of(st.just(b""), frames, publishish, spoilt))
    fast = fast_side(max_payload=10, max_control_line=4096)
    general = general_side(max_payload=10, max_control_line=4096)
    assert _outcome(fast, raw, cuts, runs=limit) == _outcome(general, raw, cuts)


def test_a_run_is_the_messages_that_repeat_the_line_exactly() -> None:
    conn = p.ServerConnection()
    conn.receive_data(b"PUB a 2\r\nhi\r\nPUB a 2\r\nho\r\nPUB a 2\r\nhu\r\nPUB a 3\r\nhey\r\nPUB a 3\r\nyes\r\n")
    assert conn.next_event() == p.Pub("a", "", b"hi")
    assert conn.repeats(1) == [b"ho"]
    assert conn.repeats(9) == [b"hu"]  # a different size ends the run
    assert conn.next_event() == p.Pub("a", "", b"hey")
    assert conn.repeats(9) == [b"yes"]
    assert conn.next_event() is p.NEED_DATA
    assert conn.repeats(9) == []


@pytest.mark.parametrize("inside", [b"x\r\nPUB a 14\r\nx", b"ab\r\nPUB a 14\r\n", b"\r\nPUB a 14\r\nab"])
def test_a_payload_that_holds_its_own_control_line_is_one_payload(inside: bytes) -> None:
    frame = b"PUB a 14\r\n%b\r\n"
    conn = p.ServerConnection()
    conn.receive_data(frame % b"0123456789abcd" + frame % inside + frame % b"0123456789abcd" + frame % inside)
    assert conn.next_event() == p.Pub("a", "", b"0123456789abcd")
    assert conn.repeats(9) == [inside, b"0123456789abcd", inside]
    assert conn.next_event() is p.NEED_DATA


def test_a_run_ends_at_another_operation_of_the_same_length() -> None:
    payload, inside = b"0123456789abcd", b"x\r\nPUB a 14\r\nx"

    def frames(*parts: tuple[bytes, bytes]) -> bytes:
        return b"".join(b"PUB %b 14\r\n%b\r\n" % part for part in parts)

    # Another operation in the run, and a payload that holds the run's control line after it.
    conn = p.ServerConnection()
    conn.receive_data(frames((b"a", payload), (b"a", payload), (b"b", payload), (b"a", inside)))
    assert conn.next_event() == p.Pub("a", "", payload)
    assert conn.repeats(9) == [payload]
    assert [conn.next_event(), conn.next_event()] == [p.Pub("b", "", payload), p.Pub("a", "", inside)]
    # Another operation first, then the run's own line again.
    conn = p.ServerConnection()
    conn.receive_data(frames((b"a", payload), (b"b", payload), (b"a", payload)))
    assert conn.next_event() == p.Pub("a", "", payload)
    assert conn.repeats(9) == []
    assert conn.next_event() == p.Pub("b", "", payload)


def test_the_fast_path_takes_what_peers_send() -> None:
    conn = p.ServerConnection()
    conn.receive_data(b"PUB foo 3\r\nabc\r\nPUB foo _INBOX.1 0\r\n\r\n")
    assert conn._fast_message(conn._buf, 0) == (p.Pub("foo", "", b"abc"), 16)
    assert [conn.next_event(), conn.next_event()] == [p.Pub("foo", "", b"abc"), p.Pub("foo", "_INBOX.1", b"")]
    client = p.ClientConnection()
    client.receive_data(b"MSG foo 7 2\r\nhi\r\nMSG foo 7 _INBOX.1 0\r\n\r\n")
    assert client._fast_message(client._buf, 0) == (p.Msg("foo", "7", "", b"hi"), 17)
    assert [client.next_event(), client.next_event()] == [
        p.Msg("foo", "7", "", b"hi"),
        p.Msg("foo", "7", "_INBOX.1", b""),
    ]
