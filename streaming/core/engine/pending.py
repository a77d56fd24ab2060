"""One subscription's unacknowledged messages: deadline lanes, the due queue, attempt counts.

Messages are kept in *lanes*, one per redelivery delay (one lane with a fixed AckWait, one per distinct
delay with backoff). A lane is an insertion-ordered dict `seq -> deadline`, and every insertion uses
`now + delay` with a clock that never goes back, so each lane is in deadline order: finding what has
expired stops at the first entry not yet due, and no heap, task or timer object exists per message.

The *due* queue holds messages to send as soon as the subscription can take them: moved here from a
leaving queue member, recovered after a restart, pending on a resumed durable, or expired while the
opt-in MaxInflight-on-redeliveries limit was reached. It is drained before any new message.

A message the subscriber gave back with a negative ack (nak) and a delay waits in the *nak* set until
its time comes, then joins the due queue. Naks are rare next to deliveries, so they have a heap of
their own (entries that no longer apply are skipped when they surface) and cost nothing while none
waits.

Attempt counts are stored only for messages sent more than once (most pending messages are on their
first attempt), which keeps a pending message at about 100 bytes.

A dict keeps its table when its entries are deleted, so a lane, the due queue or the attempt counts
emptied after a large backlog (a million pending after a restart: ~140 MB) would hold that memory
until as many new entries had passed through. Each is replaced by a fresh one when it empties and its
table is large.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from heapq import heappop, heappush
from itertools import repeat
from operator import sub
from sys import getsizeof
from typing import Protocol

from streaming.core.engine.events import Reason

# An emptied container whose table is larger than this (a dict sized for ~20,000 entries) is replaced.
_LARGE_TABLE = 1 << 20


class PendingSet:
    __slots__ = ("_attempts", "_due", "_lanes", "_nak_heap", "_naked", "_size")

    def __init__(self) -> None:
        self._lanes: dict[float, dict[int, float]] = {}  # delay -> {seq: deadline}, deadline order
        # seq -> why it is due, in the order it became due. An OrderedDict, not a dict: due messages
        # are taken from the front one at a time, and finding a dict's first entry after deleting
        # the ones before it walks over their empty slots (100,000 due after a restart: ~4 s).
        self._due: OrderedDict[int, Reason] = OrderedDict()
        self._attempts: dict[int, int] = {}  # seq -> deliveries so far, only when > 1
        # seq -> when a nak'd message comes back: (clock time, Unix ns, which the store keeps)
        self._naked: dict[int, tuple[float, int]] = {}
        self._nak_heap: list[tuple[float, int]] = []  # (when, seq); an entry `_naked` disagrees with is stale
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, seq: int) -> bool:
        if seq in self._due:
            return True
        for lane in self._lanes.values():  # a plain loop, no generator: on the ack path
            if seq in lane:
                return True
        return seq in self._naked

    def __iter__(self) -> Iterator[int]:
        yield from self._due
        for lane in self._lanes.values():
            yield from lane
        yield from self._naked

    @property
    def due_count(self) -> int:
        return len(self._due)

    @property
    def in_flight(self) -> int:
        """Messages sent and not yet expired, nor given back with a nak (what MaxInflight bounds)."""
        return self._size - len(self._due) - len(self._naked)

    @property
    def nak_count(self) -> int:
        """Messages given back with a nak and waiting for their delay."""
        return len(self._naked)

    def naked_until(self, seq: int) -> tuple[float, int] | None:
        """When `seq`, given back with a nak, comes back: (clock time, Unix ns); None if it is not
        waiting for a nak's delay."""
        return self._naked.get(seq)

    def nak(self, seq: int, until: float, until_unix_ns: int) -> bool:
        """`seq` was given back with a nak: it leaves its lane (or the due queue) and waits until `until`
        (`until_unix_ns` on the wall clock), then becomes due (`release_naks`). It stays pending. False
        if it was not pending."""
        if self._due.pop(seq, None) is None and not self._drop_from_lanes(seq):
            return False
        self._naked[seq] = (until, until_unix_ns)
        heappush(self._nak_heap, (until, seq))
        return True

    def release_naks(self, now: float) -> list[int]:
        """The nak'd messages whose delay has passed, in the order of their times: each becomes due."""
        heap, naked = self._nak_heap, self._naked
        out: list[int] = []
        while heap and heap[0][0] <= now:
            until, seq = heappop(heap)
            entry = naked.get(seq)
            if entry is not None and entry[0] == until:
                del naked[seq]
                self._due[seq] = Reason.NAK
                out.append(seq)
        if not naked:
            heap.clear()
        return out

    def attempt(self, seq: int) -> int:
        return self._attempts.get(seq, 1)

    def sent(self, seq: int, attempt: int, delay: float, deadline: float) -> None:
        """Record a (re)delivery of `seq` whose deadline is `deadline` (= now + delay)."""
        if self._due.pop(seq, None) is None and not self._drop_from_lanes(seq):
            self._size += 1
        lane = self._lanes.get(delay)
        if lane is None:
            lane = self._lanes[delay] = {}
        lane[seq] = deadline
        if attempt > 1:
            self._attempts[seq] = attempt

    def sent_first(self, seq: int, delay: float, deadline: float) -> None:
        """Record the first delivery of a message that was not pending (the common case)."""
        lane = self._lanes.get(delay)
        if lane is None:
            lane = self._lanes[delay] = {}
        lane[seq] = deadline
        self._size += 1

    def sent_first_many(self, seqs: list[int], delay: float, deadline: float) -> None:
        """`sent_first` of each of `seqs`, all sent at once."""
        lane = self._lanes.get(delay)
        if lane is None:
            lane = self._lanes[delay] = {}
        lane.update(dict.fromkeys(seqs, deadline))
        self._size += len(seqs)

    def add_due(self, seq: int, attempt: int, reason: Reason) -> None:
        """Make `seq` pending and due now (it keeps its attempt count)."""
        if seq not in self._due and not self._drop_from_lanes(seq):
            self._size += 1
        self._due[seq] = reason
        if attempt > 1:
            self._attempts[seq] = attempt

    def add_due_many(self, attempts: dict[int, int], reason: Reason) -> None:
        """`add_due` of each of `attempts` (seq -> attempt count), in sequence order: a recovered
        subscription's pending messages. Into an empty set (recovery) it is a few C loops."""
        if self._size:
            for seq in sorted(attempts):
                self.add_due(seq, attempts[seq], reason)
            return
        self._due = OrderedDict.fromkeys(sorted(attempts), reason)
        self._attempts = {seq: attempt for seq, attempt in attempts.items() if attempt > 1}
        self._size = len(self._due)

    def remove(self, seq: int) -> tuple[int, float] | None:
        """Forget `seq`; returns (attempt, delivered at) or None if it was not pending.

        `delivered at` is the clock time of its last delivery, or -1.0 if it was waiting in the due queue.
        """
        if self._due.pop(seq, None) is not None:
            delivered = -1.0
        else:
            for delay, lane in self._lanes.items():
                deadline = lane.pop(seq, None)
                if deadline is not None:
                    delivered = deadline - delay
                    break
            else:
                if not self._naked or self._naked.pop(seq, None) is None:
                    return None
                delivered = -1.0
        self._size -= 1
        attempt = self._attempts.pop(seq, 1)
        if not self._size:
            self._release_emptied()
        return attempt, delivered

    def remove_many(self, seqs: list[int]) -> tuple[list[tuple[int, float] | None], bool]:
        """`remove` of each of `seqs`, in order, and whether every one removed was on its first attempt.

        With one lane (a fixed AckWait, the usual) each is a dict pop in C, not a call: a burst of acks
        costs a few C loops, whatever its length. What that lane does not hold (due, or not pending)
        goes through `remove`."""
        if len(self._lanes) != 1 or self._naked:
            removed = [self.remove(seq) for seq in seqs]
            return removed, all(r is None or r[0] == 1 for r in removed)
        ((delay, lane),) = self._lanes.items()
        deadlines = list(map(lane.pop, seqs, repeat(None)))
        if None in deadlines:
            return self._remove_rest(seqs, deadlines, delay)
        self._size -= len(seqs)
        delivered = map(sub, deadlines, repeat(delay))
        if not self._attempts:
            if not lane:
                self._release_emptied()
            return list(zip(repeat(1), delivered)), True
        attempts = list(map(self._attempts.pop, seqs, repeat(1)))
        if not lane:
            self._release_emptied()
        return list(zip(attempts, delivered, strict=True)), max(attempts, default=1) == 1

    def _remove_rest(
        self, seqs: list[int], deadlines: list[float | None], delay: float
    ) -> tuple[list[tuple[int, float] | None], bool]:
        """`remove_many` once the one lane has given what it held (`deadlines`, None where it held nothing)."""
        removed: list[tuple[int, float] | None] = []
        first = True
        for seq, deadline in zip(seqs, deadlines, strict=True):
            if deadline is None:
                entry = self.remove(seq)
            else:
                self._size -= 1
                entry = (self._attempts.pop(seq, 1), deadline - delay)
            if entry is not None and entry[0] != 1:
                first = False
            removed.append(entry)
        if not self._lanes.get(delay):
            self._release_emptied()
        return removed, first

    def touch(self, seq: int, now: float) -> bool:
        """Restart the wait of an in-flight message (ack-progress): it goes to the end of its lane."""
        for delay, lane in self._lanes.items():
            if lane.pop(seq, None) is not None:
                lane[seq] = now + delay
                return True
        return False

    def next_deadline(self) -> float | None:
        """The earliest lane deadline or nak's end (the due queue is the caller's business)."""
        earliest: float | None = None
        heap, naked = self._nak_heap, self._naked
        while heap:
            entry = naked.get(heap[0][1])
            if entry is not None and entry[0] == heap[0][0]:
                earliest = heap[0][0]
                break
            heappop(heap)  # acked, re-sent or nak'd again since
        for lane in self._lanes.values():
            for deadline in lane.values():
                if earliest is None or deadline < earliest:
                    earliest = deadline
                break
        return earliest

    def pop_expired(self, now: float, limit: int) -> list[tuple[int, float]]:
        """Up to `limit` in-flight messages whose deadline has passed, as (seq, delay), oldest first.

        They leave the lanes but stay pending (counted, and acks still find them once the caller
        puts them back with `sent` or `add_due`).
        """
        found: list[tuple[float, int, float]] = []
        for delay, lane in self._lanes.items():
            for taken, (seq, deadline) in enumerate(lane.items()):
                if deadline > now or taken >= limit:
                    break
                found.append((deadline, seq, delay))
        if len(self._lanes) > 1:
            found.sort()
            del found[limit:]
        out = []
        for _, seq, delay in found:
            del self._lanes[delay][seq]
            self._due[seq] = Reason.ACK_TIMEOUT  # parked until the caller re-sends or moves it
            out.append((seq, delay))
        return out

    def due(self) -> Iterator[int]:
        return iter(self._due)

    def peek_due(self) -> tuple[int, Reason] | None:
        for seq, reason in self._due.items():
            return seq, reason
        if getsizeof(self._due) > _LARGE_TABLE:  # drained: the first look at the empty queue frees it
            self._due = OrderedDict()
        return None

    def make_all_due(self, reason: Reason) -> None:
        """Every pending message becomes due, in sequence order (durable resume), except those given
        back with a nak: they still wait for their delay."""
        everything = sorted(seq for seq in self if seq not in self._naked)
        self._due = OrderedDict.fromkeys(everything, reason)
        self._lanes = {}

    def _release_emptied(self) -> None:
        """Fresh containers for the emptied ones whose tables are large (see the module's docstring)."""
        for delay, lane in self._lanes.items():
            if not lane and getsizeof(lane) > _LARGE_TABLE:
                self._lanes[delay] = {}
        if not self._attempts and getsizeof(self._attempts) > _LARGE_TABLE:
            self._attempts = {}
        if not self._due and getsizeof(self._due) > _LARGE_TABLE:
            self._due = OrderedDict()

    def _drop_from_lanes(self, seq: int) -> bool:
        """Take `seq` out of its lane, or out of the nak set; whether it was in either."""
        if any(lane.pop(seq, None) is not None for lane in self._lanes.values()):
            return True
        return bool(self._naked) and self._naked.pop(seq, None) is not None


class Tally(Protocol):
    count: int


class SharedPendingSet(PendingSet):
    """A pending set whose size also counts in a shared `tally` (a wildcard subscription's MaxInflight
    across its channels). Every change of size goes through `_size`, so the tally is kept without a
    line in the hot paths of the plain `PendingSet`."""

    __slots__ = ("_own", "_tally")

    def __init__(self, tally: Tally) -> None:
        self._tally = tally
        self._own = 0
        super().__init__()

    @property
    def _size(self) -> int:
        return self._own

    @_size.setter
    def _size(self, value: int) -> None:
        self._tally.count += value - self._own
        self._own = value
