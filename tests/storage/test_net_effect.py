"""`net_effect` drops only writes that a later write of the same key replaces, and pending entries a
batch both creates (a fresh SetPending) and clears: applying what it keeps leaves both stores exactly
as applying the whole batch does."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from storage import (
    ClearPending,
    DeleteSubscription,
    LmdbStore,
    MemoryStore,
    SaveSubscription,
    SetLastSent,
    SetPending,
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


UPDATES: st.SearchStrategy[SubUpdate] = st.one_of(
    st.builds(SetPending, SUBS, SEQS, st.integers(1, 3), st.booleans()),
    st.builds(ClearPending, SUBS, SEQS),
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
    after `setup` and the batch before it: what the engine promises when it sets the flag."""
    pending = PendingEntries()
    out: list[SubUpdate] = []
    for i, update in enumerate([*setup, *batch]):
        if isinstance(update, SetPending) and update.fresh and (update.sub_id, update.seq) in pending:
            update = SetPending(update.sub_id, update.seq, update.attempt, False)
        pending.apply(update)
        if i >= len(setup):
            out.append(update)
    return out


@settings(max_examples=300, deadline=None)
@given(setup=st.lists(UPDATES, max_size=8), batch=st.lists(UPDATES, max_size=30))
def test_the_net_effect_leaves_each_store_as_the_whole_batch_does(
    setup: list[SubUpdate], batch: list[SubUpdate]
) -> None:
    batch = _fresh_only_where_new(setup, batch)
    kept = net_effect(batch)
    assert all(any(k is u for u in batch) for k in kept)  # a subsequence: nothing made up
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
