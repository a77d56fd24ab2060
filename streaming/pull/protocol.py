"""HTTP pull consumers, sans-IO: consumer options, delivery tags, step links and the acknowledgement
rules. Time is given, never read; nothing here awaits or does I/O.

A consumer holds the messages the engine sent its subscription in two places: `ready` (sent by the
engine, not yet handed to a pull: messages sent again first, lowest sequence first, then new ones in
order) and `bound` (handed out in a pull's response, under a delivery tag). Every hand-out mints a
fresh tag; the tag is good while that delivery is current, and void for ever once the message is
re-enqueued (its AckWait passed, a nack, the consumer closed or expired). An ack names its delivery
by the tag (`If-Match`); repeating a settled ack with the same outcome is answered as the first was.
"""

from __future__ import annotations

import datetime
import re
import secrets
from collections import deque
from collections.abc import Mapping
from typing import Any, Final

import attrs

from streaming.core.outbound import MAX_NAK_DELAY_S, StartPosition

MAX_INFLIGHT_CAP: Final = 1024  # NATS Streaming's default MaxInflight
_MINTED_TAIL: Final = re.compile(r"[1-9][0-9]*-[0-9a-f]+")  # a tag's delivery count and serial


class BadParameter(Exception):
    """A malformed request parameter; `name` is the parameter, `str()` says why."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__(f"{name}: {text}")
        self.name = name


@attrs.frozen
class PullSettings:
    max_pull_wait_s: float = 30.0  # the longest a pull may block (Accept-Wait / Prefer: wait=)
    tombstone_ttl_s: float = 3600.0  # how long an expired or deleted consumer is remembered
    ack_replay_window_s: float = 600.0  # how long a settled tag answers a repeated ack
    ack_replay_405: bool = False  # answer a repeated ack with 405 (REST-* POST-once-exactly clients)
    sweep_s: float = 1.0  # how often idle consumers are looked for
    msg_headers: bool = False  # also give each link as an Artemis REST `msg-*` header


@attrs.frozen
class ConsumerOptions:
    ack_manual: bool = True
    durable: str = ""
    group: str = ""
    ordered: bool = False  # the group keeps the channel's order: one message out at a time
    start: StartPosition = StartPosition.NEW_ONLY
    start_sequence: int = 0
    start_time_delta_ns: int = 0
    ack_wait_s: int = 30
    max_inflight: int = 1
    idle_timeout_s: float = 300.0

    def as_json(self) -> dict[str, Any]:
        return {
            "ack": "manual" if self.ack_manual else "auto",
            "durable": self.durable or None,
            "group": self.group or None,
            "ordered": self.ordered,
            "ack_wait": self.ack_wait_s,
            "max_inflight": self.max_inflight,
            "idle_timeout": self.idle_timeout_s,
        }


def _int(form: Mapping[str, str], name: str, default: int, low: int, high: int | None = None) -> int:
    text = form.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadParameter(name, f"expected a whole number, got {text!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise BadParameter(name, f"must be {bound}, got {value}")
    return value


def _name(form: Mapping[str, str], name: str) -> str:
    value = form.get(name, "")
    if value and (len(value) > 255 or not all(c.isalnum() or c in "._-" for c in value) or ":" in value):
        raise BadParameter(name, "letters, digits, '.', '_' and '-' only (at most 255)")
    return value


def parse_options(form: Mapping[str, str], now_unix_ns: int) -> ConsumerOptions:
    """Consumer options from a form or JSON object of strings; raises BadParameter."""
    ack_text = form.get("ack")
    auto_text = form.get("autoAck")
    if ack_text not in (None, "", "manual", "auto"):
        raise BadParameter("ack", f"expected manual or auto, got {ack_text!r}")
    if auto_text not in (None, "", "true", "false"):
        raise BadParameter("autoAck", f"expected true or false, got {auto_text!r}")
    ack_manual = not (ack_text == "auto" or auto_text == "true")
    start, sequence, delta = _start(form.get("start", "") or "new", now_unix_ns)
    ordered_text = form.get("ordered")
    if ordered_text not in (None, "", "true", "false"):
        raise BadParameter("ordered", f"expected true or false, got {ordered_text!r}")
    group = _name(form, "group")
    if ordered_text == "true" and not group:
        raise BadParameter("ordered", "keeps a queue group's order: give a group too")
    return ConsumerOptions(
        ack_manual=ack_manual,
        durable=_name(form, "durable"),
        group=group,
        ordered=ordered_text == "true",
        start=start,
        start_sequence=sequence,
        start_time_delta_ns=delta,
        ack_wait_s=_int(form, "ack_wait", 30, 1, 24 * 3600),
        max_inflight=_int(form, "max_inflight", 1, 1, MAX_INFLIGHT_CAP),
        idle_timeout_s=float(_int(form, "idle_timeout", 300, 1, 7 * 24 * 3600)),
    )


def _start(text: str, now_unix_ns: int) -> tuple[StartPosition, int, int]:
    if text == "new":
        return StartPosition.NEW_ONLY, 0, 0
    if text == "first":
        return StartPosition.FIRST, 0, 0
    if text == "last":
        return StartPosition.LAST_RECEIVED, 0, 0
    kind, _, value = text.partition(":")
    try:
        if kind == "seq" and int(value) >= 1:
            return StartPosition.SEQUENCE_START, int(value), 0
        if kind == "ago" and float(value) >= 0:
            return StartPosition.TIME_DELTA_START, 0, int(float(value) * 1e9)
        if kind == "time":
            at = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            if at.tzinfo is None:
                raise ValueError("no time zone")
            delta = now_unix_ns - int(at.timestamp() * 1e9)
            return StartPosition.TIME_DELTA_START, 0, max(delta, 0)
    except ValueError:
        pass
    raise BadParameter("start", f"expected new, first, last, seq:<n>, time:<RFC 3339> or ago:<seconds>, got {text!r}")


def parse_wait(accept_wait: str | None, prefer: str | None, cap: float) -> float:
    """Seconds a pull may block: `Accept-Wait: <s>` or `Prefer: wait=<s>`; capped; 0 when absent."""
    text = accept_wait
    if text is None and prefer:
        for part in prefer.split(","):
            name, _, value = part.strip().partition("=")
            if name.strip().lower() == "wait":
                text = value.strip()
    if text is None or text == "":
        return 0.0
    try:
        wait = float(text)
    except ValueError:
        raise BadParameter("Accept-Wait", f"expected seconds, got {text!r}") from None
    if wait < 0 or wait != wait:
        raise BadParameter("Accept-Wait", f"expected seconds >= 0, got {text!r}")
    return min(wait, cap)


@attrs.define(slots=True)
class Handout:
    """A message as a pull hands it out (what a replay of the same step repeats)."""

    seq: int
    timestamp_unix_ns: int
    data: bytes
    count: int  # delivery count, 1 on the first
    tag: str  # "" in auto-ack mode
    deadline_unix_s: float  # when its AckWait ends (wall clock, for Msg-Ack-Deadline)
    content_type: str = ""  # the publisher's, "" when it gave none


@attrs.define(slots=True)
class Bound:
    handout: Handout
    deadline: float  # the server clock's AckWait end


@attrs.define(slots=True)
class Settled:
    seq: int
    outcome: str  # "acked", "nacked" or "void"
    at: float
    why: str = ""  # for "void": expired, redelivered, closed


@attrs.define(slots=True)
class Ready:
    """A message waiting for a pull. `borrowed`: taken from another member of the queue group, whose
    engine subscription still holds it (acks reach it through the group)."""

    seq: int
    timestamp_unix_ns: int
    data: bytes
    attempt: int
    content_type: str = ""
    borrowed: bool = False


@attrs.frozen
class AckDecision:
    status: int  # 204, 409, 412, 404, 405
    action: str = ""  # "ack" or "nack" when the engine is to be told
    body: dict[str, Any] | None = None


class Consumer:
    """One pull consumer's state: its ready messages, its deliveries, its step and its settled tags."""

    def __init__(self, consumer_id: str, channel: str, options: ConsumerOptions, epoch: str, now: float) -> None:
        self.id = consumer_id
        self.channel = channel
        self.options = options
        self.epoch = epoch
        self.step = 0  # the last step that produced a message
        self.last: Handout | None = None  # what that step handed out (replayed on a retry)
        self.redelivered: dict[int, Ready] = {}  # re-enqueued, handed out lowest sequence first
        self.new: deque[Ready] = deque()
        self.bound: dict[int, Bound] = {}
        self.settled: dict[str, Settled] = {}
        self.counts: dict[int, int] = {}  # seq -> delivery count of its latest hand-out here
        self.delivered: dict[int, float] = {}  # seq -> when last handed out here (for 404 vs 412)
        self.borrowed: set[int] = set()  # bound here, held by another member's engine subscription
        self.naked: set[int] = set()  # nacked with a delay: the engine holds them back, still pending here
        self.waiting = 0  # pulls waiting for a message
        self.last_active = now

    # -- what the engine sends ---------------------------------------------------------------------

    def offer(
        self, seq: int, timestamp_unix_ns: int, data: bytes, attempt: int, now: float, content_type: str = ""
    ) -> None:
        """The engine sent `seq` to this consumer's subscription: it waits for a pull. A delivery of
        it already handed out here is void from now on."""
        bound = self.bound.pop(seq, None)
        if bound is not None:
            self._void(bound, now, "expired" if now >= bound.deadline else "redelivered")
        self.naked.discard(seq)
        entry = Ready(seq, timestamp_unix_ns, data, attempt, content_type)
        if attempt > 1 or seq in self.counts:
            self.redelivered[seq] = entry
            self.new = deque(e for e in self.new if e.seq != seq)
        else:
            self.new.append(entry)

    def forget(self, seq: int, now: float, why: str) -> None:
        """The engine moved `seq` elsewhere (another queue member has it now): void it here."""
        bound = self.bound.pop(seq, None)
        if bound is not None:
            self._void(bound, now, why)
        self.naked.discard(seq)
        self.redelivered.pop(seq, None)  # a copy waiting here is stale too
        if any(e.seq == seq for e in self.new):
            self.new = deque(e for e in self.new if e.seq != seq)

    def window(self) -> int:
        """How many pending messages its engine subscription should hold: those handed out and not
        settled (but those another member's subscription holds), and one per waiting pull. The engine
        sends new messages only up to it, so none waits here for a pull that may never come."""
        return len(self.bound) - len(self.borrowed) + len(self.naked) + self.waiting

    # -- queue-group sharing -------------------------------------------------------------------------

    def first_redelivered(self) -> int | None:
        """The lowest re-enqueued sequence waiting here (None: none)."""
        return min(self.redelivered) if self.redelivered else None

    def lend(self, seq: int | None = None) -> Ready | None:
        """A waiting message for another member of the queue group, which has none to pull: the
        re-enqueued `seq`, or (None) the oldest new one. It stays this subscription's in the engine."""
        entry = self.redelivered.pop(seq, None) if seq is not None else (self.new.popleft() if self.new else None)
        if entry is not None:
            entry.borrowed = True
        return entry

    # -- pulls -------------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        return bool(self.redelivered or self.new)

    def full(self) -> bool:
        return len(self.bound) >= self.options.max_inflight

    def take(self, now: float, wall_s: float, serial: str, lent: Ready | None = None) -> Handout | None:
        """Hand out `lent` (from another member) or the next ready message (sent-again ones first),
        under a fresh tag."""
        if lent is not None:
            entry = lent
        elif self.redelivered:
            entry = self.redelivered.pop(min(self.redelivered))
        elif self.new:
            entry = self.new.popleft()
        else:
            return None
        count = max(entry.attempt, self.counts.get(entry.seq, 0) + 1)
        self.counts[entry.seq] = count
        self.delivered[entry.seq] = now
        ack_wait = self.options.ack_wait_s
        tag = ""
        if self.options.ack_manual:
            tag = f"{self.epoch}-{self.id}-{entry.seq}-{count}-{serial}"
            handout = Handout(
                entry.seq, entry.timestamp_unix_ns, entry.data, count, tag, wall_s + ack_wait, entry.content_type
            )
            self.bound[entry.seq] = Bound(handout, now + ack_wait)
            if entry.borrowed:
                self.borrowed.add(entry.seq)
            return handout
        return Handout(
            entry.seq, entry.timestamp_unix_ns, entry.data, count, tag, wall_s + ack_wait, entry.content_type
        )

    def replayable(self, now: float) -> Handout | None:
        """What a retry of the last step gets again: its delivery if still current (manual), or the
        cached message (auto)."""
        last = self.last
        if last is None:
            return None
        if not self.options.ack_manual:
            return last
        bound = self.bound.get(last.seq)
        if bound is None or bound.handout.tag != last.tag or now >= bound.deadline:
            return None
        return last

    # -- acks --------------------------------------------------------------------------------------

    def decide(
        self, if_match: str | None, seq: int, acknowledge: bool, now: float, settings: PullSettings
    ) -> AckDecision:
        """What an ack (or nack, `acknowledge=False`) of `seq` with this `If-Match` comes to. The
        caller carries out `action` with the engine, then calls `settle`."""
        if if_match is None:
            return AckDecision(428, body={"error": "precondition-required", "detail": 'send If-Match: "<etag>"'})
        tags = _tags(if_match)
        if (
            seq not in self.delivered
            and not any(s.seq == seq for s in self.settled.values())
            and not any(self._minted(tag, seq) for tag in tags)
        ):
            return AckDecision(404, body={"error": "not-delivered", "seq": seq})
        bound = self.bound.get(seq)
        if bound is not None and now >= bound.deadline:  # its AckWait passed: the message is re-enqueued
            del self.bound[seq]
            self._void(bound, now, "expired")
            bound = None
        wanted = "acked" if acknowledge else "nacked"
        for tag in tags:
            if tag == "*":
                if bound is not None:
                    return AckDecision(204, action="ack" if acknowledge else "nack")
                continue
            if bound is not None and bound.handout.tag == tag:
                return AckDecision(204, action="ack" if acknowledge else "nack")
            settled = self.settled.get(tag)
            if settled is None and self._minted(tag, seq):
                # A tag of ours for this message that is neither current nor remembered: its
                # delivery was settled or voided longer ago than the replay window.
                return AckDecision(412, body={"error": "stale-delivery", "seq": seq, "state": "forgotten"})
            if settled is None or settled.seq != seq:
                continue
            if settled.outcome == "void":
                return AckDecision(412, body={"error": "stale-delivery", "seq": seq, "state": settled.why})
            if now - settled.at > settings.ack_replay_window_s:
                return AckDecision(412, body={"error": "stale-delivery", "seq": seq, "state": "forgotten"})
            if settled.outcome != wanted:
                return AckDecision(409, body={"error": "conflict", "seq": seq, "state": settled.outcome})
            return AckDecision(405 if settings.ack_replay_405 else 204)
        return AckDecision(412, body={"error": "stale-delivery", "seq": seq, "state": "unknown-tag"})

    def settle(self, seq: int, acknowledge: bool, now: float, *, requeue: bool = True) -> Ready | None:
        """An ack or nack of the current delivery of `seq` took effect. A nacked message is ready
        again at once, ahead of newer ones, unless not `requeue` (the engine sends it again after the
        nack's delay): then it is returned, for `requeue_ready` should the engine not take it."""
        bound = self.bound.pop(seq)
        borrowed = seq in self.borrowed
        self.borrowed.discard(seq)
        tag = bound.handout.tag
        if acknowledge:
            self.settled[tag] = Settled(seq, "acked", now)
            self.counts.pop(seq, None)
        else:
            self.settled[tag] = Settled(seq, "nacked", now)
            h = bound.handout
            ready = Ready(seq, h.timestamp_unix_ns, h.data, h.count + 1, h.content_type, borrowed)
            if not requeue:
                return ready
            self.redelivered[seq] = ready
        return None

    def requeue_ready(self, ready: Ready) -> None:
        """A nacked message the engine did not take back is ready here again, ahead of newer ones."""
        self.redelivered[ready.seq] = ready

    def current_tag(self, seq: int, now: float) -> str | None:
        bound = self.bound.get(seq)
        return bound.handout.tag if bound is not None and now < bound.deadline else None

    def state_of(self, seq: int, now: float) -> dict[str, Any] | None:
        """The acknowledgement resource of `seq` here, for GET (None: never delivered here)."""
        bound = self.bound.get(seq)
        if bound is not None and now < bound.deadline:
            h = bound.handout
            return {"seq": seq, "state": "in-flight", "delivery_count": h.count, "deadline": h.deadline_unix_s}
        states = [s for s in self.settled.values() if s.seq == seq]
        if states:
            latest = max(states, key=lambda s: s.at)
            return {
                "seq": seq,
                "state": "void" if latest.outcome == "void" else latest.outcome,
                "delivery_count": self.counts.get(seq, 0),
                "deadline": None,
            }
        if seq in self.delivered:
            return {"seq": seq, "state": "void", "delivery_count": self.counts.get(seq, 0), "deadline": None}
        return None

    def void_all(self, now: float, why: str) -> None:
        """The consumer closed or expired: every delivery it holds is void."""
        for bound in self.bound.values():
            self._void(bound, now, why)
        self.bound.clear()
        self.borrowed.clear()
        self.redelivered.clear()
        self.new.clear()

    def prune(self, now: float, window_s: float) -> None:
        """Forget settled tags (and deliveries) older than the replay window."""
        cutoff = now - window_s
        self.settled = {t: s for t, s in self.settled.items() if s.at >= cutoff}
        self.delivered = {q: at for q, at in self.delivered.items() if at >= cutoff or q in self.bound}

    def _minted(self, tag: str, seq: int) -> bool:
        """Whether `tag` has the form of a tag this consumer minted for `seq` (what `take` makes), so
        that `seq` was handed out here even once its delivery has been forgotten."""
        prefix = f"{self.epoch}-{self.id}-{seq}-"
        return tag.startswith(prefix) and _MINTED_TAIL.fullmatch(tag, len(prefix)) is not None

    def _void(self, bound: Bound, now: float, why: str) -> None:
        self.borrowed.discard(bound.handout.seq)
        self.settled[bound.handout.tag] = Settled(bound.handout.seq, "void", now, why)


def _tags(if_match: str) -> list[str]:
    """The entity tags of an If-Match value, unquoted; weak tags (W/) never match, so they are left out."""
    out = []
    for part in if_match.split(","):
        tag = part.strip()
        if not tag or tag.startswith("W/"):
            continue
        if len(tag) >= 2 and tag[0] == tag[-1] == '"':
            tag = tag[1:-1]
        out.append(tag)
    return out


def new_id() -> str:
    return secrets.token_hex(8)


def parse_delay(value: str | None, acknowledge: bool) -> float:
    """A nack's `delay`: seconds (a decimal number, 0 to 30 days) before the message is handed out
    again; absent is 0. Raises BadParameter, also for a delay on an ack."""
    if value is None or value == "":
        return 0.0
    if acknowledge:
        raise BadParameter("delay", "only a nack (acknowledge=false) has a delay")
    try:
        delay = float(value)
    except ValueError:
        raise BadParameter("delay", f"expected seconds, got {value!r}") from None
    if not 0 <= delay <= MAX_NAK_DELAY_S:  # also NaN
        raise BadParameter("delay", f"expected 0 to {MAX_NAK_DELAY_S:.0f} seconds, got {value!r}")
    return delay


def parse_acknowledge(value: object) -> bool:
    """The `acknowledge` field: true (also when absent) or false; raises BadParameter."""
    if value is None or value == "" or value is True or value == "true":
        return True
    if value is False or value == "false":
        return False
    raise BadParameter("acknowledge", f"expected true or false, got {value!r}")
