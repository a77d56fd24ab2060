"""`net_effect` drops only writes that a later write of the same key replaces, and pending entries a
batch both creates (a fresh SetPending, or a run of first deliveries) and clears: applying what it
keeps leaves both stores exactly as applying the whole batch does."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from storage import (
    ClearPending,
    ClearPendingRun,
    DeleteSubscription,
    LmdbStore,
    MemoryStore,
    SaveSubscription,
    SetLastSent,
    SetPending,
    SetPendingRun,
    Store,
    SubscriptionRecord,
    SubUpdate,
    net_effect,
)
from tests.storage.pending_model import PendingEntries

SUBS = st.integers(1, 2)
SEQS = st.integers(1, 4)


def _record(sub_id: int, last_sent: int) -> SubscriptionRecord:
    return SubscriptionRecord(sub_id, "ch", "c", f"_INBOX.{sub_id}", f"_ACK.{sub_id}", 1000, 10, last_sent=last_sent)


RUN_SEQS = st.lists(SEQS, unique=True, max_size=4)
UPDATES: st.SearchStrategy[SubUpdate] = st.one_of(
    st.builds(SetPending, SUBS, SEQS, st.integers(1, 3), st.booleans()),
    st.builds(ClearPending, SUBS, SEQS),
    st.builds(SetPendingRun, SUBS, RUN_SEQS),
    st.builds(ClearPendingRun, SUBS, RUN_SEQS),
    st.builds(SetLastSent, SUBS, SEQS),
    st.builds(lambda s, n: SaveSubscription(_record(s, n)), SUBS, SEQS),
    st.builds(DeleteSubscription, SUBS),
)


State = list[tuple[SubscriptionRecord, dict[int, int]]]


def _state(store: Store) -> State:
    return [(s.record, dict(s.pending)) for s in store.recover().subscriptions]


def _after(store: Store, setup: list[SubUpdate], batch: list[SubUpdate]) -> State:
    # Both subscriptions exist to begin with: `recover` shows only the pending entries of those.
    store.apply([SaveSubscription(_record(sub_id, 0)) for sub_id in (1, 2)])
    store.apply(setup)
    store.apply(batch)
    return _state(store)


def _fresh_only_where_new(setup: list[SubUpdate], batch: list[SubUpdate]) -> list[SubUpdate]:
    """The batch with `fresh` kept only on a SetPending whose entry is not pending at that point,
    after `setup` and the batch before it, and runs of first deliveries only of entries not pending:
    what the engine promises when it sets the flag or makes the run."""
    pending = PendingEntries()
    out: list[SubUpdate] = []
    for i, update in enumerate([*setup, *batch]):
        if isinstance(update, SetPending) and update.fresh and (update.sub_id, update.seq) in pending:
            update = SetPending(update.sub_id, update.seq, update.attempt, False)
        elif isinstance(update, SetPendingRun):
            update = SetPendingRun(update.sub_id, [seq for seq in update.seqs if (update.sub_id, seq) not in pending])
        pending.apply(update)
        if i >= len(setup):
            out.append(update)
    return out


def _taken_from(kept: SubUpdate, batch: list[SubUpdate]) -> bool:
    """An update of the batch, or a non-empty part of one of its runs."""
    if any(kept is update for update in batch):
        return True
    return isinstance(kept, SetPendingRun | ClearPendingRun) and any(
        type(update) is type(kept) and update.sub_id == kept.sub_id and set(kept.seqs) <= set(update.seqs) and kept.seqs
        for update in batch
    )


@settings(max_examples=300, deadline=None)
@given(setup=st.lists(UPDATES, max_size=8), batch=st.lists(UPDATES, max_size=30))
def test_the_net_effect_leaves_each_store_as_the_whole_batch_does(
    setup: list[SubUpdate], batch: list[SubUpdate]
) -> None:
    batch = _fresh_only_where_new(setup, batch)
    kept = net_effect(batch)
    assert all(_taken_from(k, batch) for k in kept)  # nothing made up
    assert _after(MemoryStore("c"), setup, batch) == _after(MemoryStore("c"), setup, kept)
    with tempfile.TemporaryDirectory() as tmp:
        whole, net = LmdbStore(Path(tmp) / "a", "c"), LmdbStore(Path(tmp) / "b", "c")
        try:
            assert _after(whole, setup, batch) == _after(net, setup, kept)
        finally:
            whole.close()
            net.close()


# Sets and clears of two entries of one subscription only: the interleavings that matter for fresh
# entries (cleared, set fresh again, cleared) come up far more often than among every kind of update.
ENTRY_UPDATES: st.SearchStrategy[SubUpdate] = st.one_of(
    st.builds(SetPending, st.just(1), st.integers(1, 2), st.integers(1, 3), st.booleans()),
    st.builds(ClearPending, st.just(1), st.integers(1, 2)),
    st.builds(SetPendingRun, st.just(1), st.lists(st.integers(1, 2), unique=True, max_size=2)),
    st.builds(ClearPendingRun, st.just(1), st.lists(st.integers(1, 2), unique=True, max_size=2)),
)


@settings(max_examples=300, deadline=None)
@given(setup=st.lists(ENTRY_UPDATES, max_size=4), batch=st.lists(ENTRY_UPDATES, max_size=12))
def test_the_net_effect_of_pending_entries_alone(setup: list[SubUpdate], batch: list[SubUpdate]) -> None:
    batch = _fresh_only_where_new(setup, batch)
    assert _after(MemoryStore("c"), setup, batch) == _after(MemoryStore("c"), setup, net_effect(batch))


def test_a_redelivery_acked_in_the_same_batch_is_one_delete() -> None:
    batch: list[SubUpdate] = [SetPending(1, 5, 2), SetPending(1, 6, 2), ClearPending(1, 5), SetLastSent(1, 6)]
    assert net_effect(batch) == [SetPending(1, 6, 2), ClearPending(1, 5), SetLastSent(1, 6)]


def test_a_first_delivery_acked_in_the_same_batch_is_not_written() -> None:
    """Neither its entry nor a delete of it: the store never had one. A redelivery's (not fresh: the
    store may hold its entry from an earlier batch) still ends in a delete."""
    batch: list[SubUpdate] = [
        SetPending(1, 5, 1, True),
        SetPending(1, 6, 2),
        SetPending(1, 7, 1, True),
        SetLastSent(1, 7),
        ClearPending(1, 5),
        ClearPending(1, 6),
    ]
    assert net_effect(batch) == [SetPending(1, 7, 1, True), SetLastSent(1, 7), ClearPending(1, 6)]


def test_acks_of_first_deliveries_in_the_same_batch_cancel_run_against_run() -> None:
    """The common case under load: a read's first deliveries, then a read's acks. What is left of each
    run is written as a narrower run; a redelivery acked in the batch still ends in a delete."""
    batch: list[SubUpdate] = [
        SetPendingRun(1, [1, 2, 3, 4]),
        SetPending(1, 9, 2),
        SetLastSent(1, 4),
        ClearPendingRun(1, [1, 2, 9]),
        SetPendingRun(1, [5, 6]),
        SetLastSent(1, 6),
        ClearPendingRun(1, [3, 5]),
    ]
    assert net_effect(batch) == [
        SetPendingRun(1, [4]),
        ClearPendingRun(1, [9]),
        SetPendingRun(1, [6]),
        SetLastSent(1, 6),
    ]
