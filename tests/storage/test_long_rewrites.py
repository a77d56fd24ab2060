"""Long records written again in the same transaction (a subscription or client record of more than a
page's worth, saved twice in one batch): the state file they leave passes the structure walk, so the
store opens its own healthy file; and a file written before the store deleted such records first
(LMDB's run longer than its value) is accepted, while anything that does not add up is still damage."""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from typing import Any

import attrs
import lmdb
import pytest

from storage import LmdbStore, SaveClient, SaveSubscription
from storage.environment import put_again
from storage.records import ClientRecord
from storage.state_walk import structure_problems, without_reused_runs
from tests.storage.test_contract import sub_record


def test_a_long_subscription_and_client_saved_shorter_in_one_batch_reopen(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path)
    store.ensure_channel("foo")
    sub = store.new_subscription_id()
    long = sub_record(sub, durable_name="d" * 9000, is_durable=True)
    client = ClientRecord("client-1", "_INBOX." + "h" * 6000)
    store.apply(
        [
            SaveSubscription(long),
            SaveClient(client),
            SaveSubscription(attrs.evolve(long, durable_name="d" * 3000)),
            SaveClient(attrs.evolve(client, hb_inbox="_INBOX.short")),
        ]
    )
    store.close()
    assert structure_problems(tmp_path / "state") == []
    store = LmdbStore(tmp_path)
    try:
        recovered = store.recover()
        assert [s.record.durable_name for s in recovered.subscriptions] == ["d" * 3000]
        assert [c.hb_inbox for c in recovered.clients] == ["_INBOX.short"]
    finally:
        store.close()


def test_values_rewritten_at_any_length_in_one_transaction_always_walk_clean(tmp_path: Path) -> None:
    rng = random.Random(7)
    env = lmdb.open(str(tmp_path), map_size=1 << 26, max_dbs=1)
    db = env.open_db(b"records")
    try:
        for _ in range(150):
            with env.begin(write=True) as txn:
                for _ in range(rng.choice([2, 10, 60])):
                    key = b"%04d" % rng.randint(0, 40)
                    put_again(txn, key, b"v" * rng.choice([10, 900, 1500, 3000, 9000, 20000]), db)
    finally:
        env.close()
    assert structure_problems(tmp_path) == []


def plain_put(txn: lmdb.Transaction, key: bytes, value: bytes, db: lmdb._Database) -> None:
    txn.put(key, value, db=db)


def test_a_state_file_with_runs_rewritten_in_place_by_an_earlier_version_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written as versions before the delete-first rule wrote it: LMDB's runs longer than their
    values; the walk accepts them, and the store opens and reads the file."""
    monkeypatch.setattr("storage.subscription_state.put_again", plain_put)
    store = LmdbStore(tmp_path)
    store.ensure_channel("foo")
    sub = store.new_subscription_id()
    long = sub_record(sub, durable_name="d" * 9000, is_durable=True)
    store.apply([SaveSubscription(long), SaveSubscription(attrs.evolve(long, durable_name="d" * 100))])
    store.close()
    verifier: Any = importlib.import_module("lmdb.verify")
    assert verifier.verify(str(tmp_path / "state")) != [], "LMDB no longer leaves such runs: nothing to accept"
    assert structure_problems(tmp_path / "state") == []
    monkeypatch.undo()
    store = LmdbStore(tmp_path)
    try:
        assert [s.record.durable_name for s in store.recover().subscriptions] == ["d" * 100]
    finally:
        store.close()


REUSED = [
    "main/subs DB: overflow page 4 header mp_pages 3 != OVPAGES(3000)=1",
    "main/subs DB: overflow page 7 header mp_pages 5 != OVPAGES(100)=1",
    "main/subs DB: walked 2 overflow pages, record says 8",
    "6 page(s) are neither reachable nor in the freeDB -- a leak (first: page 5)",
]


def test_only_runs_whose_pages_add_up_are_let_pass() -> None:
    assert without_reused_runs(REUSED) == []
    other = "main/subs DB: page 9 keys out of order"
    assert without_reused_runs([*REUSED, other]) == [other]
    no_leak = REUSED[:3]  # the extra pages are on the free list: LMDB would free them twice
    assert without_reused_runs(no_leak) == no_leak
    for changed in (
        [*REUSED[:3], "5 page(s) are neither reachable nor in the freeDB -- a leak (first: page 5)"],
        [*REUSED[:3], "6 page(s) are neither reachable nor in the freeDB -- a leak (first: page 6)"],
        [*REUSED[:2], "main/subs DB: walked 2 overflow pages, record says 9", REUSED[3]],
        [REUSED[0], "main/subs DB: overflow page 7 header mp_pages 1 != OVPAGES(9000)=3", *REUSED[2:]],
    ):
        assert without_reused_runs(changed) == changed
