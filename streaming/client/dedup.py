"""Suppressing redelivered copies of messages the application already acknowledged (sans-IO).

STAN redelivers a message whenever its ack did not reach the server within AckWait: after a TCP drop
that ate the ack, or while the message waited in the client's own queue. No STAN client filters those
copies. These two structures let ours do it:

- `AckFloor`, for plain and durable subscriptions, whose first deliveries come in sequence order:
  everything at or below the floor is acknowledged, and the few acknowledged sequences above it are
  kept in a set. Memory is O(messages in flight), each operation O(log n).
- `RecentAcks`, for queue members, which see a sparse, unordered subset of the sequences: a map of
  recently acknowledged sequences, bounded by size and age.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict


class AckFloor:
    def __init__(self) -> None:
        self.floor = 0  # every sequence <= floor that this subscription delivered is acknowledged
        self._outstanding: set[int] = set()  # delivered, not yet acknowledged
        self._heap: list[int] = []  # the same, for the minimum (stale entries skipped)
        self._acked_above: set[int] = set()
        self._highest = 0

    def delivered(self, seq: int) -> None:
        if seq in self._outstanding or self.is_acked(seq):
            return
        self._outstanding.add(seq)
        heapq.heappush(self._heap, seq)
        self._highest = max(self._highest, seq)

    def acked(self, seq: int) -> None:
        if seq not in self._outstanding:
            return
        self._outstanding.discard(seq)
        self._acked_above.add(seq)
        heap = self._heap
        while heap and heap[0] not in self._outstanding:
            heapq.heappop(heap)
        new_floor = heap[0] - 1 if heap else self._highest
        if new_floor > self.floor:
            self.floor = new_floor
            self._acked_above = {s for s in self._acked_above if s > new_floor}

    def is_acked(self, seq: int) -> bool:
        return (seq <= self.floor and seq not in self._outstanding) or seq in self._acked_above

    def __len__(self) -> int:
        return len(self._outstanding) + len(self._acked_above)


class RecentAcks:
    def __init__(self, max_entries: int = 100_000, max_age_s: float = 600.0) -> None:
        self._acked: OrderedDict[int, float] = OrderedDict()  # seq -> when, oldest first
        self.max_entries = max_entries
        self.max_age_s = max_age_s

    def acked(self, seq: int, now: float) -> None:
        self._acked[seq] = now
        self._acked.move_to_end(seq)
        self._trim(now)

    def is_acked(self, seq: int, now: float) -> bool:
        self._trim(now)
        return seq in self._acked

    def _trim(self, now: float) -> None:
        acked = self._acked
        while acked and (len(acked) > self.max_entries or next(iter(acked.values())) < now - self.max_age_s):
            acked.popitem(last=False)

    def __len__(self) -> int:
        return len(self._acked)
