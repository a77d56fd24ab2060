"""Where the engine gets message bodies: the batch just appended (handed over by the commit
pipeline, so new messages are never read back), a cache of messages read lately, and the store for
the rest (one read per batch, never one per message).

The cache is what makes fan-out cheap: subscriptions reading one channel's backlog side by side, or
a message redelivered to many subscriptions, read and verify each stored message once, not once per
subscription. It keeps what each store read returned as one run (a slice of a channel, found by
bisection on its first sequence), so a read served from it costs a lookup and a slice, and one that
goes to the store costs no work per message to remember. It holds two generations of up to
`_GENERATION` messages (and `_GENERATION_BYTES` of payload) each: when the newer one fills up it
becomes the older and the older is dropped, so the bound holds without a per-message eviction.

A commit's batch joins the cache when a subscription is behind it (its MaxInflight reached, or a
queue group whose members all are): the messages it takes as acks free room are then the ones the
commit built, as they are for a subscriber keeping up, not read back and checked again.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from storage.base import Store
from storage.records import Message

_GENERATION = 8192
_GENERATION_BYTES = 16 << 20


def _seq(message: Message) -> int:
    return message.seq


class _Runs:
    """One generation: per channel, runs of messages as a store read returned them (in order, gaps
    the store left skipped), sorted by their first sequence."""

    __slots__ = ("by_channel", "bytes", "messages")

    def __init__(self) -> None:
        self.by_channel: dict[str, tuple[list[int], list[Sequence[Message]]]] = {}
        self.messages = 0
        self.bytes = 0

    def add(self, channel: str, run: Sequence[Message], size: int) -> None:
        firsts, runs = self.by_channel.setdefault(channel, ([], []))
        first = run[0].seq
        i = bisect_right(firsts, first)
        firsts.insert(i, first)
        runs.insert(i, run)
        self.messages += len(run)
        self.bytes += size

    def find(self, channel: str, seq: int) -> tuple[Sequence[Message], int] | None:
        """A run holding `seq`, and its index there (the run that starts last at or before it: a run
        overlapping an earlier one may hide part of that one, which then reads from the store)."""
        found = self.by_channel.get(channel)
        if found is None:
            return None
        firsts, runs = found
        i = bisect_right(firsts, seq) - 1
        if i < 0:
            return None
        run = runs[i]
        at = seq - firsts[i]
        if at < len(run) and run[at].seq == seq:
            return run, at
        if run[-1].seq < seq:
            return None
        at = bisect_left(run, seq, key=_seq)  # a run with a gap before `seq` holds it earlier
        return (run, at) if run[at].seq == seq else None


class MessageReader:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._recent: dict[str, tuple[int, Sequence[Message]]] = {}  # channel -> just-appended messages
        self._new = _Runs()
        self._old = _Runs()

    def hold_appended(self, channel: str, messages: Sequence[Message]) -> None:
        """Serve reads of these (consecutive) messages from memory until `release_appended`."""
        if messages:
            self._recent[channel] = (messages[0].seq, messages)

    def release_appended(self, channel: str, positions: Sequence[int] = ()) -> None:
        """Reads of the held messages go elsewhere from now on: to the cache if a reader of the
        channel (`positions`: the last sequence each has taken) is behind them by less than a
        generation, as one held back by its MaxInflight is, so that it gets them from memory;
        else to the store."""
        held = self._recent.pop(channel, None)
        if held is None:
            return
        first, messages = held
        last = first + len(messages) - 1
        reach = first - 1 - _GENERATION
        if any(reach <= position < last for position in positions):
            self._keep(channel, messages)

    def forget(self) -> None:
        """Messages were dropped (limits) or a channel deleted: nothing cached may be served again."""
        self._new = _Runs()
        self._old = _Runs()

    def read(self, channel: str, start: int, count: int) -> Sequence[Message]:
        """Up to `count` messages from `start` on, in order (gaps the store left are skipped)."""
        recent = self._recent.get(channel)
        if recent is not None:
            first, messages = recent
            if first <= start < first + len(messages) and messages[start - first].seq == start:
                return messages[start - first : start - first + count]
        out: list[Message] = []
        seq = start
        while len(out) < count:  # what another subscription read lately: no store read, no check
            found = self._find(channel, seq)
            if found is None:
                break
            run, at = found
            taken = run[at : at + count - len(out)]
            out += taken
            seq = taken[-1].seq + 1
        if len(out) < count:
            read = self.store.read(channel, seq, count - len(out))
            self._keep(channel, read)
            out += read
        return out

    def read_many(self, channel: str, seqs: list[int]) -> list[Message | None]:
        """Messages for redelivery, from memory where possible; the rest from the store in one read
        (one transaction, not one per message)."""
        out: list[Message | None] = [None] * len(seqs)
        missing: list[int] = []
        recent = self._recent.get(channel)
        first, held = recent if recent is not None else (0, [])
        for i, seq in enumerate(seqs):
            if first <= seq < first + len(held):
                out[i] = held[seq - first]
            else:
                found = self._find(channel, seq)
                if found is None:
                    missing.append(i)
                else:
                    out[i] = found[0][found[1]]
        if missing:
            read = self.store.get_many(channel, [seqs[i] for i in missing])
            out_of_store = [m for m in read if m is not None]
            for i, message in zip(missing, read, strict=True):
                out[i] = message
            # Kept as runs of consecutive sequences, so that a lookup finds each where it expects it.
            start = 0
            for j in range(1, len(out_of_store) + 1):
                if j == len(out_of_store) or out_of_store[j].seq != out_of_store[j - 1].seq + 1:
                    self._keep(channel, out_of_store[start:j])
                    start = j
        return out

    def _find(self, channel: str, seq: int) -> tuple[Sequence[Message], int] | None:
        return self._new.find(channel, seq) or self._old.find(channel, seq)

    def _keep(self, channel: str, messages: Sequence[Message]) -> None:
        if not messages:
            return
        size = sum(len(m.data) for m in messages)
        new = self._new
        if new.messages + len(messages) > _GENERATION or new.bytes + size > _GENERATION_BYTES:
            self._old, self._new = new, _Runs()
        self._new.add(channel, messages, size)
