"""`net_effect` drops only writes that a later write of the same key replaces: applying what it keeps
leaves both stores exactly as applying the whole batch does."""

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

SUBS = st.integers(1, 2)
SEQS = st.integers(1, 4)


def _record(sub_id: int, last_sent: int) -> SubscriptionRecord:
    return SubscriptionRecord(sub_id, "ch", "c", f"_INBOX.{sub_id}", f"_ACK.{sub_id}", 1000, 10, last_sent=last_sent)


UPDATES: st.SearchStrategy[SubUpdate] = st.one_of(
    st.builds(SetPending, SUBS, SEQS, st.integers(1, 3)),
    st.builds(ClearPending, SUBS, SEQS),
    st.builds(SetLastSent, SUBS, SEQS),
    st.builds(lambda s, n: SaveSubscription(_record(s, n)), SUBS, SEQS),
    st.builds(DeleteSubscription, SUBS),
)


State = list[tuple[SubscriptionRecord, dict[int, int]]]


def _state(store: Store) -> State:
    return [(s.record, dict(s.pending)) for s in store.recover().subscriptions]


def _after(store: Store, setup: list[SubUpdate], batch: list[SubUpdate]) -> State:
    store.apply(setup)
    store.apply(batch)
    return _state(store)


@settings(max_examples=150, deadline=None)
@given(setup=st.lists(UPDATES, max_size=8), batch=st.lists(UPDATES, max_size=30))
def test_the_net_effect_leaves_each_store_as_the_whole_batch_does(
    setup: list[SubUpdate], batch: list[SubUpdate]
) -> None:
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


def test_a_redelivery_acked_in_the_same_batch_is_one_delete() -> None:
    batch: list[SubUpdate] = [SetPending(1, 5, 2), SetPending(1, 6, 2), ClearPending(1, 5), SetLastSent(1, 6)]
    assert net_effect(batch) == [SetPending(1, 6, 2), ClearPending(1, 5), SetLastSent(1, 6)]
