"""Which pending entries a sequence of subscription updates leaves, as both stores apply them: what
the tests of `SetPending.fresh` (the engine's promise, `net_effect`'s use of it) walk alongside."""

from __future__ import annotations

from storage import ClearPending, ClearPendingRun, DeleteSubscription, SetPending, SetPendingRun, SubUpdate


class PendingEntries:
    """(sub id, seq) of every pending entry, updated one `SubUpdate` at a time."""

    def __init__(self, entries: set[tuple[int, int]] | None = None) -> None:
        self.entries = set(entries or ())

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def apply(self, update: SubUpdate) -> None:
        if isinstance(update, SetPending):
            self.entries.add((update.sub_id, update.seq))
        elif isinstance(update, ClearPending):
            self.entries.discard((update.sub_id, update.seq))
        elif isinstance(update, SetPendingRun):
            self.entries.update((update.sub_id, seq) for seq in update.seqs)
        elif isinstance(update, ClearPendingRun):
            self.entries.difference_update((update.sub_id, seq) for seq in update.seqs)
        elif isinstance(update, DeleteSubscription):
            self.entries = {key for key in self.entries if key[0] != update.sub_id}
