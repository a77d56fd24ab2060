"""Long records written again in the same transaction (a subscription or client record of more than a
page's worth, saved twice in one batch): the state file they leave passes the structure walk, so the
store opens its own healthy file."""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import lmdb

from storage import LmdbStore, SaveClient, SaveSubscription
from storage.environment import put_again
from storage.records import ClientRecord
from storage.state_walk import structure_problems
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
