"""The delivery event log: JSON Lines (schema in `streaming.observability.event_schema`) for the Spark jobs.

The hot paths append one preformatted string per delivery event, or per run of first deliveries or
acks (a few fragments cached per subscription), and one entry per channel per publish burst. A run
whose sequences follow one another, as a subscriber's backlog and its in-order acks do, is one line
with `last_seq`: the log costs a few bytes per message, not a line each. A writer task joins what
accumulated every `interval` seconds and writes it on a worker thread, into `events-<start>-<n>.jsonl`
files that roll over past `rotate_bytes`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import trio

from streaming.core.engine import (
    Acked,
    AckedRun,
    AckTimedOut,
    DeadLettered,
    Delivered,
    DeliveredRun,
    Event,
    MemberJoined,
    MemberLeft,
    Naked,
    Reason,
    SubRef,
)

log = logging.getLogger(__name__)

_NEW = Reason.NEW


class _SubLines:
    """The JSON a subscription's lines share, made once per subscription: around `seq` for any event
    (`"channel":...,"seq":` and `,"sub":...,"group":...,"member":...,`, with `,"last_seq":null` before
    it for one event), and whole suffixes for a first delivery (at the AckWait last seen) and its ack,
    alone or as a run."""

    __slots__ = (
        "ack_first",
        "ack_head",
        "ack_run",
        "ack_wait_s",
        "deliver_first",
        "deliver_head",
        "deliver_run",
        "head",
        "one",
        "sub",
        "tail",
    )

    def __init__(self, sub: SubRef, head: str, tail: str) -> None:
        self.sub = sub
        self.head = head
        self.tail = tail
        self.one = f',"last_seq":null{tail}'
        self.ack_wait_s: float | None = None
        self.deliver_head = f'"event":"deliver",{head}'
        self.deliver_first = self.deliver_run = ""
        self.ack_head = f'"event":"ack",{head}'
        self.ack_run = f'{tail}"attempt":1,"ack_wait_s":null,"reason":null}}\n'
        self.ack_first = f',"last_seq":null{self.ack_run}'

    def set_ack_wait(self, ack_wait_s: float) -> None:
        self.ack_wait_s = ack_wait_s
        self.deliver_run = f'{self.tail}"attempt":1,"ack_wait_s":{ack_wait_s!r},"reason":"new"}}\n'
        self.deliver_first = f',"last_seq":null{self.deliver_run}'


class EventLog:
    def __init__(self, directory: Path, *, rotate_bytes: int = 64 * 1024 * 1024, interval: float = 0.05) -> None:
        self.directory = directory
        self.rotate_bytes = rotate_bytes
        self.interval = interval
        self._pending: list[bytes | tuple[int, str, int, int]] = []  # lines, and publish runs
        self._lines = 0  # lines in `_pending`
        self._quoted: dict[str, str] = {}
        self._subs: dict[int, _SubLines] = {}  # by id(SubRef)
        self._sub_lines = self._subs.get
        self._file: IO[bytes] | None = None
        self._file_size = 0
        self._files = 0
        self._stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.written = 0  # events written so far

    # -- observers (hot paths: one append) -------------------------------------------------------

    def on_events(self, events: Sequence[Event], _now_ns: Callable[[], int] = time.time_ns) -> None:
        # Encoded at once: a string is cheaper to keep until the next write than the event object
        # (which the garbage collector would otherwise walk over, many thousands at a time). The
        # events of one engine pass share one timestamp. A run of first deliveries, or of acks of
        # first deliveries, is one string: one line from `seq` to `last_seq` when its sequences
        # follow one another, else its lines, which differ only in `seq`: the subscription's
        # cached prefix and suffix joined around the sequences, in C.
        ts = _now_ns() // 1000
        out: list[str] = []
        append = out.append
        lines = 0
        for event in events:
            sub = event.sub
            c = self._sub_lines(id(sub))
            if c is None or c.sub is not sub:  # `is`: an id can be reused once a SubRef is gone
                c = self._cache(sub)
            if type(event) is DeliveredRun:
                if event.ack_wait_s != c.ack_wait_s:
                    c.set_ack_wait(event.ack_wait_s)
                append(
                    _run(f'{{"ts":{ts},{c.deliver_head}', event.seqs, c.deliver_run, c.deliver_first, ascending=True)
                )
                lines += len(event.seqs) - 1
            elif type(event) is AckedRun:
                seqs = event.seqs
                lines += len(seqs) - 1
                if event.first_attempts:
                    append(_run(f'{{"ts":{ts},{c.ack_head}', seqs, c.ack_run, c.ack_first))
                else:
                    for seq, attempt in zip(seqs, event.attempts(), strict=True):
                        append(_ack(ts, c, seq, attempt))
            elif type(event) is Delivered:
                if event.attempt == 1 and event.reason is _NEW:
                    if event.ack_wait_s != c.ack_wait_s:
                        c.set_ack_wait(event.ack_wait_s)
                    append(f'{{"ts":{ts},{c.deliver_head}{event.seq}{c.deliver_first}')
                else:
                    append(
                        f'{{"ts":{ts},"event":"deliver",{c.head}{event.seq}{c.one}"attempt":{event.attempt},'
                        f'"ack_wait_s":{event.ack_wait_s!r},"reason":"{event.reason._value_}"}}\n'
                    )
            elif type(event) is Acked:
                append(_ack(ts, c, event.seq, event.attempt))
            else:
                encode = _ENCODERS.get(type(event))
                if encode is None:
                    continue
                append(encode(ts, c.head, c.one, event))
            lines += 1
        # Bytes, one chunk per pass: the writer thread hands them to the file as they are, so it
        # holds the interpreter lock for no join or encode of its own.
        if out:
            self._pending.append("".join(out).encode())
            self._lines += lines

    def on_published(self, channel: str, first_seq: int, count: int, nbytes: int) -> None:
        self._pending.append((time.time_ns() // 1000, channel, first_seq, count))
        self._lines += count

    def on_commit(self, seconds: float, messages: int) -> None:
        pass

    def on_takeover(self, group: str, member: str) -> None:
        """This server became the active of its FT group (`streaming.ft.group`)."""
        line = (
            f'{{"ts":{time.time_ns() // 1000},"event":"ft_takeover","channel":null,"seq":null,"last_seq":null,'
            f'"sub":null,"group":{self._q(group)},"member":{self._q(member)},"attempt":null,"ack_wait_s":null,'
            '"reason":null}\n'
        )
        self._pending.append(line.encode())
        self._lines += 1

    # -- writer ------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(lambda: self.directory.mkdir(parents=True, exist_ok=True))
        start = f'{{"ts":{time.time_ns() // 1000},"event":"server_start","channel":null,"seq":null{_NO_SEQ}'
        await trio.to_thread.run_sync(self._write, [start.encode()], 1)
        task_status.started()
        try:
            while True:
                await trio.sleep(self.interval)
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                await self.flush()
                if self._file is not None:
                    await trio.to_thread.run_sync(self._file.close)

    async def flush(self) -> None:
        batch, lines = self._pending.copy(), self._lines
        self._pending.clear()
        self._lines = 0
        if batch:
            await trio.to_thread.run_sync(self._write, self._encode(batch), lines)

    def _write(self, chunks: list[bytes], lines: int) -> None:
        if self._file is None or self._file_size >= self.rotate_bytes:
            if self._file is not None:
                self._file.close()
            self._files += 1
            path = self.directory / f"events-{self._stamp}-{self._files:06d}.jsonl"
            self._file = path.open("ab")
            self._file_size = 0
        self._file.writelines(chunks)
        self._file.flush()
        self._file_size += sum(map(len, chunks))
        self.written += lines

    # -- encoding ----------------------------------------------------------------------------------

    def _cache(self, sub: SubRef) -> _SubLines:
        if len(self._subs) > 100_000:
            self._subs.clear()
        q = self._q
        group = sub.group
        head = f'"channel":{q(sub.channel)},"seq":'
        tail = f',"sub":{sub.sub_id},"group":{q(group) if group else "null"},"member":{q(sub.client_id)},'
        cached = self._subs[id(sub)] = _SubLines(sub, head, tail)
        return cached

    def _q(self, text: str) -> str:
        quoted = self._quoted.get(text)
        if quoted is None:
            if len(self._quoted) > 100_000:
                self._quoted.clear()
            quoted = self._quoted[text] = json.dumps(text)
        return quoted

    def _encode(self, batch: list[bytes | tuple[int, str, int, int]]) -> list[bytes]:
        out: list[bytes] = []
        q = self._q
        for item in batch:
            if isinstance(item, bytes):
                out.append(item)
            else:
                ts, channel, first, count = item
                line = f'{{"ts":{ts},"event":"publish","channel":{q(channel)},"seq":{first}'
                last = f',"last_seq":{first + count - 1}{_NO_SUB}' if count > 1 else _NO_SEQ
                out.append(f"{line}{last}".encode())
        return out


def _run(head: str, seqs: list[int], run_tail: str, one_tail: str, *, ascending: bool = False) -> str:
    """The lines of a run of events that differ only in `seq`: one line (`head`, the first sequence,
    `last_seq`, `run_tail`) when its sequences follow one another, else a line per sequence ending in
    `one_tail`. Telling which is a comparison in C, not a step per sequence; none at all when the
    sequences are known to be `ascending` (then its first and last tell)."""
    n = len(seqs)
    if n > 1 and seqs[-1] - seqs[0] == n - 1 and (ascending or seqs == list(range(seqs[0], seqs[0] + n))):
        return f'{head}{seqs[0]},"last_seq":{seqs[-1]}{run_tail}'
    return _joined(head, seqs, one_tail)


def _joined(head: str, seqs: Iterable[int], tail: str) -> str:
    """One line per sequence, each `head`, the sequence, `tail` (which ends the line): joined in C."""
    return head + (tail + head).join(map(str, seqs)) + tail


def _ack(ts: int, c: _SubLines, seq: int, attempt: int) -> str:
    if attempt == 1:
        return f'{{"ts":{ts},{c.ack_head}{seq}{c.ack_first}'
    return f'{{"ts":{ts},"event":"ack",{c.head}{seq}{c.one}"attempt":{attempt},"ack_wait_s":null,"reason":null}}\n'


# The fields after `seq` (or `last_seq`) of an event about no subscription (publish, server_start).
_NO_SUB = ',"sub":null,"group":null,"member":null,"attempt":null,"ack_wait_s":null,"reason":null}\n'
_NO_SEQ = f',"last_seq":null{_NO_SUB}'


def _ack_timeout(ts: int, head: str, tail: str, e: AckTimedOut) -> str:
    return (
        f'{{"ts":{ts},"event":"ack_timeout",{head}{e.seq}{tail}"attempt":{e.attempt},'
        f'"ack_wait_s":{e.ack_wait_s!r},"reason":null}}\n'
    )


def _nak(ts: int, head: str, tail: str, e: Naked) -> str:
    return (
        f'{{"ts":{ts},"event":"nak",{head}{e.seq}{tail}"attempt":{e.attempt},'
        f'"ack_wait_s":{e.delay_s!r},"reason":null}}\n'
    )


def _dead_letter(ts: int, head: str, tail: str, e: DeadLettered) -> str:
    return (
        f'{{"ts":{ts},"event":"dead_letter",{head}{e.seq}{tail}"attempt":{e.attempts},'
        '"ack_wait_s":null,"reason":"max_deliver"}\n'
    )


def _member(kind: str) -> Any:
    def encode(ts: int, head: str, tail: str, e: MemberJoined | MemberLeft) -> str:
        return f'{{"ts":{ts},"event":"{kind}",{head}null{tail}"attempt":null,"ack_wait_s":null,"reason":null}}\n'

    return encode


# The rarer events (deliveries and acks are encoded in `EventLog.on_events` itself).
_ENCODERS: dict[type, Any] = {
    AckTimedOut: _ack_timeout,
    Naked: _nak,
    DeadLettered: _dead_letter,
    MemberJoined: _member("member_join"),
    MemberLeft: _member("member_leave"),
}
