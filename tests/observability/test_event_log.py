"""The delivery event log written by a real server: every line matches the schema, and the events
tell the story of the scripted run (publishes, redelivery, member leave, dead letter)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st

from streaming.observability.event_schema import EVENTS, FIELDS, MAX_RUN, each_event, problems
from tests.observability.traffic import AUDIT, DLQ_CHANNEL, ORDERS, RETRY, scripted_run
from tests.support.servers import config, running


def read_lines(directory: Path) -> list[dict[str, Any]]:
    files = sorted(directory.glob("events-*.jsonl"))
    assert files, f"no event log files in {directory}"
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def read_events(directory: Path) -> list[dict[str, Any]]:
    """The events of the log in `directory`, a run's line spelt out as its events."""
    return [event for line in read_lines(directory) for event in each_event(line)]


async def test_the_server_writes_events_that_match_the_schema(tmp_path: Path) -> None:
    log_dir = tmp_path / "events"
    async with running(config(tmp_path / "data", event_log=str(log_dir))) as server:
        async with scripted_run(server.port):
            pass
    lines = read_lines(log_dir)  # the server flushed on shutdown
    bad = [(e, problems(e)) for e in lines if problems(e)]
    assert not bad, bad[:5]
    assert any(line["last_seq"] is not None for line in lines)  # a burst of publishes is one line
    events = read_events(log_dir)

    kinds = Counter(e["event"] for e in events)
    # Every kind occurs in the scripted run, but a takeover, which needs an FT group (tests/ft).
    assert set(kinds) == set(EVENTS) - {"ft_takeover"}, kinds
    assert kinds["server_start"] == 1
    assert kinds["publish"] == ORDERS + AUDIT + 3  # the poison message, its dead letter, the nak'd one
    published = {(e["channel"], e["seq"]) for e in events if e["event"] == "publish"}
    assert ("orders", ORDERS) in published and (DLQ_CHANNEL, 1) in published

    deliveries = [e for e in events if e["event"] == "deliver"]
    reasons = Counter(e["reason"] for e in deliveries)
    assert reasons["member_left"] == 5
    assert reasons["ack_timeout"] >= 2  # d1's orders #1 and the poison message's second attempt
    timeouts = [e for e in events if e["event"] == "ack_timeout" and e["group"] == "d1"]
    assert timeouts and timeouts[0]["seq"] == 1 and timeouts[0]["ack_wait_s"] == 0.2
    (dead,) = [e for e in events if e["event"] == "dead_letter"]
    assert (dead["channel"], dead["seq"], dead["attempt"], dead["reason"]) == ("jobs", 1, 2, "max_deliver")
    (nak,) = [e for e in events if e["event"] == "nak"]
    assert (nak["channel"], nak["seq"], nak["attempt"], nak["ack_wait_s"]) == (RETRY, 1, 1, 0.05)
    assert [(e["attempt"], e["reason"]) for e in deliveries if e["channel"] == RETRY] == [(1, "new"), (2, "nak")]
    leaves = [e for e in events if e["event"] == "member_leave"]
    assert {e["member"] for e in leaves} == {"mon-q1", "mon-q2"} and {e["group"] for e in leaves} == {"workers"}

    # Acks name the attempt they acknowledged; timestamps never go backwards within a file.
    acked = {(e["channel"], e["sub"], e["seq"], e["attempt"]) for e in events if e["event"] == "ack"}
    assert ("orders", timeouts[0]["sub"], 1, 2) in acked
    stamps = [e["ts"] for e in events]
    assert stamps == sorted(stamps)
    assert 1_700_000_000_000_000 < stamps[0] < 4_000_000_000_000_000  # microseconds since the epoch


async def test_the_log_rolls_over_by_size_and_loses_nothing(tmp_path: Path) -> None:
    log_dir = tmp_path / "events"
    cfg = config(tmp_path / "data", event_log=str(log_dir), event_log_rotate=4096)
    async with running(cfg) as server:
        assert server.event_log is not None
        server.event_log.interval = 0.01  # many small batches, so rotation happens mid-run
        async with scripted_run(server.port):
            await trio.sleep(0.1)
    files = sorted(log_dir.glob("events-*.jsonl"))
    assert len(files) >= 2
    assert all(f.stat().st_size < 4096 + 64 * 1024 for f in files)
    events = read_events(log_dir)
    assert sum(1 for e in events if e["event"] == "publish") == ORDERS + AUDIT + 3
    assert not [e for e in read_lines(log_dir) if problems(e)]


def test_the_schema_check_catches_what_it_should() -> None:
    good = {
        "ts": 1,
        "event": "deliver",
        "channel": "c",
        "seq": 1,
        "last_seq": None,
        "sub": 3,
        "group": None,
        "member": "m",
        "attempt": 1,
        "ack_wait_s": 30.0,
        "reason": "new",
    }
    assert problems(good) == []
    assert problems({**good, "reason": "because"})
    assert problems({**good, "event": "explode"})
    assert problems({**good, "seq": "1"})
    assert problems({**good, "attempt": None})
    assert problems({k: v for k, v in good.items() if k != "ts"})
    run = {**good, "last_seq": 9}
    assert problems(run) == []
    assert [e["seq"] for e in each_event(run)] == list(range(1, 10))
    assert all(problems(e) == [] and e["last_seq"] is None for e in each_event(run))
    assert problems({**good, "last_seq": 1})  # a run is two or more
    assert problems({**good, "last_seq": 0})
    assert problems({**good, "last_seq": MAX_RUN + 1})
    assert problems({**good, "event": "ack_timeout", "last_seq": 5})  # not an event that runs


def test_the_monitoring_page_documents_the_schema_as_it_is() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "monitoring.md").read_text()
    for name, (kind, meaning) in FIELDS.items():
        assert f"| `{name}` | {kind} | {meaning} |" in readme, name
    for event in EVENTS:
        assert f"`{event}` (" in readme, event


def _lines(log: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in b"".join(log._encode(list(log._pending))).splitlines()]


def _events(log: Any) -> list[dict[str, Any]]:
    return [event for line in _lines(log) for event in each_event(line)]


def test_cached_lines_follow_each_events_own_fields(tmp_path: Path) -> None:
    """The per-subscription fast path must not reuse a first delivery's AckWait, attempt or reason
    for an event that differs from it, in a run or alone."""
    from streaming.core.engine import Acked, AckedRun, Delivered, DeliveredRun, Event, Reason, SubRef
    from streaming.observability.event_log import EventLog

    log = EventLog(tmp_path)
    sub = SubRef("orders", 7, "client-a", queue_group="workers")
    events: list[Event] = [
        Delivered(sub, 1, 1, Reason.NEW, 30.0),
        Acked(sub, 1, 1, 0.5),
        Delivered(sub, 2, 1, Reason.NEW, 5.0),  # AckWait changed on the same subscription
        Delivered(sub, 2, 2, Reason.ACK_TIMEOUT, 5.0),
        AckedRun(sub, 1.0, [2], [(2, 0.9)], first_attempts=False),
        Delivered(sub, 3, 1, Reason.MEMBER_LEFT, 5.0),
        DeliveredRun(sub, [4, 5], 9.0),
        AckedRun(sub, 1.0, [4, 3, 5], [(1, 0.9), (2, 0.8), (1, 0.7)], first_attempts=False),
        AckedRun(sub, 1.0, [6, 8, 7, 9], [(1, 0.9)] * 4),  # from 6 to 9, not in order: not one line
    ]
    log.on_events(events)
    lines = _lines(log)
    assert [problems(line) for line in lines] == [[]] * len(lines)
    got = [(r["event"], r["seq"], r["attempt"], r["ack_wait_s"], r["reason"], r["group"]) for r in _events(log)]
    assert got == [
        ("deliver", 1, 1, 30.0, "new", "workers"),
        ("ack", 1, 1, None, None, "workers"),
        ("deliver", 2, 1, 5.0, "new", "workers"),
        ("deliver", 2, 2, 5.0, "ack_timeout", "workers"),
        ("ack", 2, 2, None, None, "workers"),
        ("deliver", 3, 1, 5.0, "member_left", "workers"),
        ("deliver", 4, 1, 9.0, "new", "workers"),
        ("deliver", 5, 1, 9.0, "new", "workers"),
        ("ack", 4, 1, None, None, "workers"),
        ("ack", 3, 2, None, None, "workers"),
        ("ack", 5, 1, None, None, "workers"),
        ("ack", 6, 1, None, None, "workers"),
        ("ack", 8, 1, None, None, "workers"),
        ("ack", 7, 1, None, None, "workers"),
        ("ack", 9, 1, None, None, "workers"),
    ]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["deliver", "ack"]),
            st.integers(0, 2),  # which subscription
            st.one_of(
                st.lists(st.tuples(st.integers(1, 10**12), st.integers(1, 3)), min_size=1, max_size=5),
                st.tuples(st.integers(1, 10**12), st.lists(st.integers(1, 3), min_size=1, max_size=5)).map(
                    lambda run: [(run[0] + i, attempt) for i, attempt in enumerate(run[1])]  # consecutive
                ),
            ),
        ),
        max_size=8,
    )
)
def test_runs_are_logged_as_their_messages_would_be(script: list[tuple[str, int, list[tuple[int, int]]]]) -> None:
    """A run of deliveries or acks stands for exactly the events its messages would, one by one, in
    order: as one line when its sequences follow one another, else as theirs."""
    from streaming.core.engine import AckedRun, DeliveredRun, Event, SubRef, per_message
    from streaming.observability.event_log import EventLog

    subs = [SubRef("orders", 1, "a"), SubRef("orders", 2, "b", durable_name="d"), SubRef("x", 3, "c", queue_group="q")]
    events: list[Event] = []
    messages = 0
    for kind, which, items in script:
        seqs = [seq for seq, _ in items]
        if kind == "deliver":  # a backlog read: ascending, each once
            seqs = sorted(set(seqs))
            events.append(DeliveredRun(subs[which], seqs, 30.0))
        else:
            acked = [(attempt, 0.5) for _, attempt in items]
            events.append(AckedRun(subs[which], 1.0, seqs, acked, all(a == 1 for a, _ in acked)))
        messages += len(seqs)
    as_runs, one_by_one = EventLog(Path("unused")), EventLog(Path("unused"))
    as_runs.on_events(events, _now_ns=lambda: 1_000_000)
    one_by_one.on_events(list(per_message(events)), _now_ns=lambda: 1_000_000)
    assert [problems(line) for line in _lines(as_runs)] == [[]] * len(_lines(as_runs))
    assert _events(as_runs) == _lines(one_by_one)
    assert len(_events(as_runs)) == messages == as_runs._lines
