"""The lease's timing, on each member's own clock (sans-IO: the clock is given).

The lease decides who *tries* to be the active, not what is safe: safety is the log's fencing (an
append that does not follow the last record is refused), so two members that both believe they are
active can never both get a write acknowledged.

No two members' clocks are compared. The active counts its lease from when it *sent* its last renewal
that succeeded; a standby counts from when it first *saw* the revision that renewal wrote, which is
later, and starts counting again whenever it could not read the lease. So the active's lease is over
by its own clock before any standby believes it lapsed, as long as the two clocks run at about the
same rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

Clock = Callable[[], float]


@attrs.define
class LeaseClock:
    """The active's side: until when it may act as the active."""

    ttl: float
    clock: Clock = time.monotonic
    valid_until: float = -1.0

    def renewed(self, sent_at: float) -> None:
        """A renewal (or the claim) sent at `sent_at` succeeded."""
        self.valid_until = sent_at + self.ttl

    def left(self) -> float:
        """Seconds the lease still lasts (<= 0: it ran out)."""
        return self.valid_until - self.clock()


@attrs.define
class LeaseWatch:
    """A standby's side: whether the holder let the lease lapse."""

    ttl: float
    clock: Clock = time.monotonic
    seen: tuple[int, float] | None = None  # the revision last seen, and when it was first seen

    def lapsed(self, revision: int | None) -> bool:
        """Told the lease's revision now (None: nobody ever held it), whether it may be claimed."""
        if revision is None:
            return True
        now = self.clock()
        if self.seen is None or self.seen[0] != revision:
            self.seen = (revision, now)
            return False
        return now - self.seen[1] >= self.ttl

    def forget(self) -> None:
        """The lease could not be read: whatever was seen counts no more (its holder may have been
        unable to renew for the same reason)."""
        self.seen = None
