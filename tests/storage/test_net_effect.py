"""`net_effect` drops only writes that a later write of the same key replaces, and pending entries a
batch both creates (a fresh SetPending, or a run of first deliveries) and clears: applying what it
keeps leaves both stores exactly as applying the whole batch does. `split_at` (a flush that cuts its
queue short) writes the state at the cut but for messages acknowledged since, and what it keeps
queued takes the store the rest of the way."""

from __future__ import annotations

import tempfile
from pathlib import Path

import attrs
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
    split_at,
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


def _pending(state: State) -> set[tuple[int, int]]:
    return {(record.sub_id, seq) for record, pending in state for seq in pending}


def _records(state: State) -> list[SubscriptionRecord]:
    """The records but for their positions (`_positions`)."""
    return [attrs.evolve(record, last_sent=0) for record, _ in state]


def _positions(state: State) -> list[int]:
    return [record.last_sent for record, _ in state]


@settings(max_examples=300, deadline=None)
@given(
    setup=st.lists(UPDATES, max_size=8),
    batch=st.lists(UPDATES, max_size=30),
    cut=st.integers(0, 30),
)
def test_a_write_cut_short_leaves_the_state_at_the_cut_but_for_what_was_acked_since(
    setup: list[SubUpdate], batch: list[SubUpdate], cut: int
) -> None:
    _check_split(setup, batch, cut)


def _check_split(setup: list[SubUpdate], batch: list[SubUpdate], cut: int) -> None:
    batch = _fresh_only_where_new(setup, batch)
    cut = min(cut, len(batch))
    now, kept = split_at(batch, cut)
    assert all(_taken_from(k, batch) for k in now + kept)  # nothing made up
    at_cut = _after(MemoryStore("c"), setup, batch[:cut])
    whole = _after(MemoryStore("c"), setup, batch)
    store = MemoryStore("c")
    written = _after(store, setup, now)
    # What a crash right after this write would recover: the records at the cut, and the pending
    # entries at the cut but for some that are gone by the end of the queue (acked). A position is
    # never past the cut's; it may be short of it (a store takes a position no lower than the last
    # pending entry's), and what it is short of is sent again after the crash, never lost.
    assert _records(written) == _records(at_cut)
    assert all(w <= c for w, c in zip(_positions(written), _positions(at_cut), strict=True))
    assert _pending(written) <= _pending(at_cut)
    assert not (_pending(at_cut) - _pending(written)) & _pending(whole), "only what is acked by the end is left out"
    store.apply(kept)
    assert _state(store) == whole


@settings(max_examples=300, deadline=None)
@given(setup=st.lists(ENTRY_UPDATES, max_size=4), batch=st.lists(ENTRY_UPDATES, max_size=12), cut=st.integers(0, 12))
def test_a_write_cut_short_of_pending_entries_alone(setup: list[SubUpdate], batch: list[SubUpdate], cut: int) -> None:
    _check_split(setup, batch, cut)


def test_first_deliveries_acked_after_the_cut_are_never_written() -> None:
    """The common case under load: a read's first deliveries before the cut, their acks after it.
    Neither the entries nor their deletes are written; a redelivery acked after the cut, and what
    stays unacked, are."""
    batch: list[SubUpdate] = [
        SetPendingRun(1, [1, 2, 3, 4]),
        SetPending(1, 9, 2),
        SetLastSent(1, 4),
        ClearPendingRun(1, [1, 2, 9]),  # the cut is here
        SetPendingRun(1, [5, 6]),
        SetLastSent(1, 6),
        ClearPendingRun(1, [3, 5]),
    ]
    now, kept = split_at(batch, 3)
    assert now == [SetPendingRun(1, [4]), SetPending(1, 9, 2), SetLastSent(1, 4)]
    assert kept == [ClearPendingRun(1, [9]), SetPendingRun(1, [5, 6]), SetLastSent(1, 6), ClearPendingRun(1, [5])]
