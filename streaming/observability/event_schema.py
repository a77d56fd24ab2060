"""The delivery event log's schema, in one place: the writer (`streaming.observability.event_log`), its test, the
README and the Spark jobs all take it from here.

Every line is one JSON object with every field below (null where a field does not apply to the event).
A line with `last_seq` stands for a run: one event per sequence from `seq` to `last_seq`, all else
equal (`each_event` spells it out).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

# field -> (JSON type, meaning); the order is the order in each line.
FIELDS: Final[dict[str, tuple[str, str]]] = {
    "ts": ("integer", "microseconds since the Unix epoch, UTC"),
    "event": ("string", "the kind of event (EVENTS)"),
    "channel": ("string", "channel name (null for server_start and ft_takeover)"),
    "seq": ("integer", "message sequence (publish, deliver, ack, ack_timeout, nak, dead_letter)"),
    "last_seq": ("integer", "a run's last sequence: one event per sequence, seq to last_seq (publish, deliver, ack)"),
    "sub": ("integer", "subscription id (unique within a server's data directory)"),
    "group": ("string", "queue group, else durable name; null for a plain subscription (ft_takeover: the FT group)"),
    "member": ("string", "client id of the subscriber (ft_takeover: the member that took over)"),
    "attempt": ("integer", "delivery attempt, 1 = first (deliver, ack, ack_timeout, nak, dead_letter)"),
    "ack_wait_s": ("number", "seconds this attempt may stay unacknowledged (deliver, ack_timeout); nak: its delay"),
    "reason": (
        "string",
        "why: deliver: new, ack_timeout, member_left, restart, resume, nak; dead_letter: max_deliver",
    ),
}

EVENTS: Final[dict[str, str]] = {
    "server_start": "the server started (or restarted) and began writing this log",
    "publish": "a message was stored",
    "deliver": "a message was sent to a subscriber",
    "ack": "a subscriber acknowledged a message",
    "ack_timeout": "a delivery's AckWait expired unacknowledged",
    "nak": "a subscriber gave a message back with a negative ack: it comes back after the delay (ack_wait_s)",
    "dead_letter": "a message used up its MaxDeliver attempts and went to the dead-letter channel",
    "member_join": "a queue member joined its group",
    "member_leave": "a queue member left; its unacknowledged messages go to the other members",
    "ft_takeover": "this server took over as its fault-tolerance group's active (after its server_start)",
}

DELIVERY_REASONS: Final = ("new", "ack_timeout", "member_left", "restart", "resume", "nak")

RUN_EVENTS: Final = ("publish", "deliver", "ack")  # the events a line may hold a run of
MAX_RUN: Final = 1 << 20  # sequences in one line at most (the server's runs are far shorter)

_PY_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "integer": (int,),
    "string": (str,),
    "number": (int, float),
}

# Fields each event must carry (non-null); the rest of FIELDS are null or, where listed, optional.
REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "server_start": ("ts", "event"),
    "publish": ("ts", "event", "channel", "seq"),
    "deliver": ("ts", "event", "channel", "seq", "sub", "member", "attempt", "ack_wait_s", "reason"),
    "ack": ("ts", "event", "channel", "seq", "sub", "member", "attempt"),
    "ack_timeout": ("ts", "event", "channel", "seq", "sub", "member", "attempt", "ack_wait_s"),
    "nak": ("ts", "event", "channel", "seq", "sub", "member", "attempt", "ack_wait_s"),
    "dead_letter": ("ts", "event", "channel", "seq", "sub", "member", "attempt", "reason"),
    "member_join": ("ts", "event", "channel", "sub", "group", "member"),
    "member_leave": ("ts", "event", "channel", "sub", "group", "member"),
    "ft_takeover": ("ts", "event", "group", "member"),
}


def problems(record: dict[str, Any]) -> list[str]:
    """What is wrong with one decoded line (empty when it matches the schema)."""
    out = []
    if list(record) != list(FIELDS):
        out.append(f"fields {list(record)} are not {list(FIELDS)}")
    event = record.get("event")
    if event not in EVENTS:
        return [*out, f"unknown event {event!r}"]
    for name, value in record.items():
        if name not in FIELDS or value is None:
            continue
        kind = FIELDS[name][0]
        if isinstance(value, bool) or not isinstance(value, _PY_TYPES[kind]):
            out.append(f"{name}={value!r} is not a JSON {kind}")
    out += [f"{event} without {name}" for name in REQUIRED[event] if record.get(name) is None]
    if event == "deliver" and record.get("reason") not in DELIVERY_REASONS:
        out.append(f"deliver with reason {record.get('reason')!r}")
    last, seq = record.get("last_seq"), record.get("seq")
    if isinstance(last, int) and not isinstance(last, bool):
        if event not in RUN_EVENTS:
            out.append(f"{event} with last_seq")
        elif isinstance(seq, int) and not 0 < last - seq < MAX_RUN:
            out.append(f"last_seq {last} is not within {MAX_RUN} after seq {seq}")
    return out


def each_event(record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events one decoded line stands for: itself, or one per sequence of its run. For a line that
    `problems` finds nothing wrong with (a run's `seq` and `last_seq` are integers)."""
    last = record.get("last_seq")
    if last is None:
        yield record
        return
    for seq in range(record["seq"], last + 1):
        yield {**record, "seq": seq, "last_seq": None}
