"""An LMDB data file that ends before the last page its meta page names, because the pages past its end
are free (LMDB took them from the end of the file and freed them in the same transaction, so it never
wrote them): a healthy file that the store opens, while a file cut into pages the trees still reach is
refused as truncated."""

from __future__ import annotations

import random
from pathlib import Path

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import DamagedStoreError, LmdbStore, NewMessage, SaveSubscription, SetPending
from storage.integrity import lmdb_file_problem
from storage.lmdb_pages import free_pages
from storage.state_walk import structure_problems
from tests.storage.test_contract import sub_record

PAGE = 4096


def free_the_tail(env_dir: Path) -> None:
    """Grow the file with pages that are then freed: a throwaway database filled in one transaction
    and dropped in the next, then two small transactions so that the free list itself moves below
    them (LMDB reuses the lowest free pages first)."""
    env = lmdb.open(str(env_dir), max_dbs=16)
    try:
        filler = env.open_db(b"filler")
        with env.begin(write=True) as txn:
            for i in range(300):
                txn.put(b"f%05d" % i, b"x" * 200, db=filler)
        with env.begin(write=True) as txn:
            txn.drop(filler, delete=True)
        for _ in range(2):
            with env.begin(write=True) as txn:
                txn.put(b"the-tail-test", b"")
            with env.begin(write=True) as txn:
                txn.delete(b"the-tail-test")
    finally:
        env.close()


def cut_free_tail(env_dir: Path) -> int:
    """Cut every page off the end of the file that the structure walk says nothing reaches: the file
    as LMDB leaves it when it never wrote them. Returns how many pages were cut."""
    data = env_dir / "data.mdb"
    raw = data.read_bytes()
    pages = len(raw) // PAGE
    cut = 0
    while cut + 1 < pages:
        data.write_bytes(raw[: (pages - cut - 1) * PAGE])
        if structure_problems(env_dir):
            break
        cut += 1
    data.write_bytes(raw[: (pages - cut) * PAGE])
    return cut


def walk_not_needed() -> list[str]:
    raise AssertionError("the free list holds every page past the end: no walk of the file is needed")


def test_a_file_that_ends_in_free_pages_is_whole_and_lmdb_uses_it(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(b"keep", b"kept")
    env.close()
    free_the_tail(tmp_path)
    assert cut_free_tail(tmp_path) > 0
    assert lmdb_file_problem(tmp_path / "data.mdb", walk=walk_not_needed) is None
    env = lmdb.open(str(tmp_path), max_dbs=16)
    with env.begin() as txn:
        assert txn.get(b"keep") == b"kept"
    with env.begin(write=True) as txn:  # reusing the missing pages writes them: the file grows back
        for i in range(400):
            txn.put(b"n%05d" % i, b"y" * 200)
    env.close()
    assert structure_problems(tmp_path) == []


def test_lmdb_leaves_files_short_on_its_own_and_every_one_is_accepted(tmp_path: Path) -> None:
    """Pending entries added and removed in the same commits while readers come and go: LMDB itself
    leaves the file a page short now and then, and the check must accept each such file."""
    rng = random.Random(1)
    env = lmdb.open(str(tmp_path), map_size=1 << 27, max_dbs=1, sync=False, metasync=False)
    pending, data = env.open_db(b"pending"), tmp_path / "data.mdb"
    seq, live, short = 0, list[int](), 0
    reader: lmdb.Transaction | None = None
    try:
        for _ in range(300):
            if rng.random() < 0.2:
                if reader is None:
                    reader = env.begin()
                else:
                    reader.abort()
                    reader = None
            with env.begin(write=True) as txn:
                for _ in range(rng.choice([1, 5, 20, 100, 400])):
                    seq += 1
                    txn.put(b"%012d" % seq, b"v" * rng.choice([8, 40, 120]), db=pending)
                    live.append(seq)
                if reader is not None and rng.random() < 0.5:
                    reader.abort()
                    reader = None
                k = rng.randint(0, len(live))  # acknowledged: the oldest entries, or the newest
                cut = k if rng.random() < 0.5 else len(live) - k
                gone, live = (live[:cut], live[cut:]) if cut == k else (live[cut:], live[:cut])
                for s in gone:
                    txn.delete(b"%012d" % s, db=pending)
            if data.stat().st_size < (env.info()["last_pgno"] + 1) * PAGE:
                short += 1
                assert lmdb_file_problem(data, walk=walk_not_needed) is None  # the free list explains it
    finally:
        if reader is not None:
            reader.abort()
        env.close()
    assert short > 0, "LMDB never left the file short: the workload no longer shows what this test is about"


def short_file_with_data(env_dir: Path) -> None:
    """An environment of 300 records whose file ends where its free pages begin."""
    env = lmdb.open(str(env_dir), max_dbs=16)
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.put(b"k%05d" % i, b"x" * 200)
    env.close()
    free_the_tail(env_dir)
    cut_free_tail(env_dir)


def test_a_file_cut_into_pages_in_use_is_truncated(tmp_path: Path) -> None:
    short_file_with_data(tmp_path)
    data = tmp_path / "data.mdb"
    data.write_bytes(data.read_bytes()[:-PAGE])  # one page more: one the trees reach
    problem = lmdb_file_problem(data)
    assert problem is not None
    assert problem.startswith("is truncated: it is ")
    assert "beyond EOF" in problem


@pytest.mark.parametrize("env", ["state", "msgs"])
def test_the_store_opens_a_file_that_ends_in_free_pages(tmp_path: Path, env: str) -> None:
    store = LmdbStore(tmp_path)
    store.ensure_channel("foo")
    store.append([NewMessage("foo", b"m%d" % i) for i in range(1, 51)])
    sub = store.new_subscription_id()
    store.apply([SaveSubscription(sub_record(sub)), *(SetPending(sub, seq, 1) for seq in range(1, 11))])
    store.close()
    free_the_tail(tmp_path / env)
    assert cut_free_tail(tmp_path / env) > 0

    store = LmdbStore(tmp_path, verify="full")
    try:
        assert [m.data for m in store.read("foo", 1, 100)] == [b"m%d" % i for i in range(1, 51)]
        (recovered,) = store.recover().subscriptions
        assert sorted(recovered.pending) == list(range(1, 11))
        store.append([NewMessage("foo", b"after")])
    finally:
        store.close()


def test_the_store_refuses_a_file_cut_into_pages_in_use(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path)
    sub = store.new_subscription_id()
    store.apply([SaveSubscription(sub_record(sub)), *(SetPending(sub, seq, 1) for seq in range(1, 2001))])
    store.close()
    data = tmp_path / "state" / "data.mdb"
    data.write_bytes(data.read_bytes()[:-PAGE])
    with pytest.raises(DamagedStoreError, match=r"state/data\.mdb is truncated: it is \d+ bytes long"):
        LmdbStore(tmp_path)


@given(damage=st.lists(st.tuples(st.integers(0, 40 * PAGE), st.binary(min_size=1, max_size=64)), max_size=12))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_reading_the_free_list_of_a_damaged_file_never_fails(tmp_path: Path, damage: list[tuple[int, bytes]]) -> None:
    """Bytes written anywhere over a short file: the free list's reader answers a set or None, and the
    length check answers, without reading outside the file."""
    template = tmp_path / "template"
    if not template.exists():
        template.mkdir()
        short_file_with_data(template)
    raw = bytearray((template / "data.mdb").read_bytes())
    for offset, data in damage:
        raw[offset : offset + len(data)] = data
    target = tmp_path / "damaged"
    target.mkdir(exist_ok=True)
    (target / "data.mdb").write_bytes(bytes(raw[: len((template / "data.mdb").read_bytes())]))
    pages = len(raw) // PAGE + 2
    for root in range(2, pages):  # the reader started at every page, damaged or not
        found = free_pages(target / "data.mdb", PAGE, root, pages)
        assert found is None or isinstance(found, set)
    problem = lmdb_file_problem(target / "data.mdb")
    assert problem is None or isinstance(problem, str)
