"""The sans-IO NATS protocol and subject matching, with no sockets."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.wire import nats as p
from streaming.wire.subjects import Sublist, valid_literal, valid_subject


def events(
    conn: p.ServerConnection | p.ClientConnection, data: bytes, *, byte_at_a_time: bool = False
) -> list[p.Event]:
    out: list[p.Event] = []
    chunks = [data[i : i + 1] for i in range(len(data))] if byte_at_a_time else [data]
    for chunk in chunks:
        conn.receive_data(chunk)
        while True:
            event = conn.next_event()
            if isinstance(event, p._NeedData):
                break
            out.append(event)
    return out


CLIENT_BYTES = (
    b'CONNECT {"verbose":false,"name":"x"}\r\n'
    b"PING\r\n"
    b"SUB foo  7\r\n"  # nats.go/nats.py: empty queue gives two spaces
    b"sub  bar.*\tq   8\r\n"  # lower case, runs of spaces and tabs
    b"PUB foo  5\r\nhello\r\n"  # nats.py: empty reply
    b"PUB foo reply.1 0\r\n\r\n"  # empty payload
    b"pub foo 3\nabc\r\n"  # bare LF
    b"UNSUB 7 \r\n"  # trailing space
    b"UNSUB 8 10\r\n"
    b"PONG\r\n"
)
EXPECTED = [
    p.Connect({"verbose": False, "name": "x"}),
    p.PING,
    p.Sub("foo", "", "7"),
    p.Sub("bar.*", "q", "8"),
    p.Pub("foo", "", b"hello"),
    p.Pub("foo", "reply.1", b""),
    p.Pub("foo", "", b"abc"),
    p.Unsub("7"),
    p.Unsub("8", 10),
    p.PONG,
]


def test_client_operations_as_real_clients_format_them() -> None:
    assert events(p.ServerConnection(), CLIENT_BYTES) == EXPECTED


def test_chunk_boundaries_do_not_matter() -> None:
    assert events(p.ServerConnection(), CLIENT_BYTES, byte_at_a_time=True) == EXPECTED


@given(st.lists(st.integers(min_value=1, max_value=len(CLIENT_BYTES) - 1), max_size=20))
def test_any_split_gives_the_same_events(cuts: list[int]) -> None:
    conn = p.ServerConnection()
    out: list[p.Event] = []
    bounds = [0, *sorted(set(cuts)), len(CLIENT_BYTES)]
    for start, end in itertools.pairwise(bounds):
        out += events(conn, CLIENT_BYTES[start:end])
    assert out == EXPECTED


subjects = st.lists(st.text("abcXYZ019_-", min_size=1, max_size=8), min_size=1, max_size=4).map(".".join)


@given(subject=subjects, reply=st.one_of(st.just(""), subjects), payload=st.binary(max_size=300))
def test_pub_round_trip(subject: str, reply: str, payload: bytes) -> None:
    assert events(p.ServerConnection(), p.encode_pub(subject, reply, payload)) == [p.Pub(subject, reply, payload)]


@given(
    subject=subjects,
    sid=st.integers(1, 10**9).map(str),
    reply=st.one_of(st.just(""), subjects),
    payload=st.binary(max_size=300),
)
def test_msg_round_trip(subject: str, sid: str, reply: str, payload: bytes) -> None:
    assert events(p.ClientConnection(), p.encode_msg(subject, sid, reply, payload)) == [
        p.Msg(subject, sid, reply, payload)
    ]


# Payloads of one size take the shared-line path, mixed sizes the line-per-message one: both must be
# exactly the messages one at a time.
@given(
    subject=subjects,
    sid=st.integers(1, 10**9).map(str),
    payloads=st.one_of(
        st.lists(st.binary(max_size=40), max_size=8),
        st.integers(0, 30).flatmap(lambda n: st.lists(st.binary(min_size=n, max_size=n), max_size=8)),
    ),
)
def test_a_run_of_msgs_is_each_msg_in_turn(subject: str, sid: str, payloads: list[bytes]) -> None:
    run = p.encode_msgs(subject, sid, payloads)
    assert run == b"".join(p.encode_msg(subject, sid, "", payload) for payload in payloads)
    assert events(p.ClientConnection(), run) == [p.Msg(subject, sid, "", payload) for payload in payloads]


def test_server_lines_parse_on_the_client_side() -> None:
    data = b"INFO {\"max_payload\":1048576}\r\n+OK\r\nPING\r\nPONG\r\n-ERR 'Unknown Protocol Operation'\r\n"
    assert events(p.ClientConnection(), data) == [
        p.Info({"max_payload": 1048576}),
        p.OK,
        p.PING,
        p.PONG,
        p.Err("Unknown Protocol Operation"),
    ]


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"FOO bar\r\n", p.UNKNOWN_OP),
        (b"PUB foo\r\n", p.UNKNOWN_OP),
        (b"PUB foo -1\r\n", p.UNKNOWN_OP),
        (b"PUB foo 3\r\nabcdef\r\n", p.UNKNOWN_OP),  # payload longer than announced
        (b"SUB\r\n", p.UNKNOWN_OP),
        (b"CONNECT {not json\r\n", p.UNKNOWN_OP),
        (b"CONNECT [1]\r\n", p.UNKNOWN_OP),
        (b"CONNECT " + b"[" * 2000 + b"]" * 2000 + b"\r\n", p.UNKNOWN_OP),  # deeper than the parser goes
        (b"PUB foo 2000000\r\n", p.MAX_PAYLOAD_VIOLATION),
        (b"PUB " + b"x" * 5000 + b" 1\r\n", p.MAX_CONTROL_EXCEEDED),
        (b"PUB " + b"x" * 5000, p.MAX_CONTROL_EXCEEDED),  # no line end yet, already too long
        (b"\xff\xfe\r\n", p.UNKNOWN_OP),
        (b"PUB \xff 1\r\nx\r\n", p.UNKNOWN_OP),
    ],
)
def test_protocol_errors_name_the_problem(data: bytes, text: str) -> None:
    with pytest.raises(p.RemoteProtocolError) as caught:
        events(p.ServerConnection(), data)
    assert str(caught.value) == text and caught.value.fatal


def test_err_text_must_be_quotable() -> None:
    assert p.encode_err("Slow Consumer") == b"-ERR 'Slow Consumer'\r\n"
    with pytest.raises(p.LocalProtocolError):
        p.encode_err("it's")
    with pytest.raises(p.LocalProtocolError):
        p.encode_pub("bad subject", "", b"")


@pytest.mark.parametrize(
    ("subject", "ok"),
    [
        ("foo", True),
        ("foo.bar", True),
        ("foo.*", True),
        ("foo.>", True),
        ("*.>", True),
        (">", True),
        ("foo..bar", False),
        (".foo", False),
        ("foo.", False),
        ("foo*.bar", False),
        ("foo.>.bar", False),
        ("foo>", False),
        ("", False),
        ("foo bar", False),
    ],
)
def test_subject_validity(subject: str, ok: bool) -> None:
    assert valid_subject(subject) is ok
    assert valid_literal(subject) is (ok and "*" not in subject and ">" not in subject)


def test_sublist_wildcards_and_queues() -> None:
    sl: Sublist[str] = Sublist()
    sl.add("exact", "foo.bar")
    sl.add("star", "foo.*")
    sl.add("tail", "foo.>")
    sl.add("all", ">")
    sl.add("q1", "foo.bar", "workers")
    sl.add("q2", "foo.*", "workers")
    got = sl.match("foo.bar")
    plain = [s for s in got if not s.startswith("q")]
    assert sorted(plain) == ["all", "exact", "star", "tail"]
    assert len([s for s in got if s.startswith("q")]) == 1  # one member per queue group
    assert sorted(sl.match("foo.bar.baz")) == ["all", "tail"]
    assert sl.match("foo") == ["all"]  # foo.> does not match foo
    sl.remove("all")
    assert sl.match("foo") == [] and not sl.has_interest("foo")
    assert sl.has_interest("foo.x")
