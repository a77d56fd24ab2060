"""The engine's message reader answers every read exactly as the store would, whatever it holds in
its cache of runs: reads and redelivery lookups at any positions, over gaps in a channel (as a repair
leaves them), across the cache's generations, with commits handed over and kept or not, and after
`forget`."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from storage import LmdbStore, NewMessage
from storage.codec import MSG_KEY
from storage.records import Message
from streaming.core.engine import reader as reader_module
from streaming.core.engine.reader import MessageReader

CHANNELS = ("a", "b")
STORED = 60


@contextmanager
def store_with_gaps(gaps: set[int]) -> Iterator[LmdbStore]:
    """Channels "a" and "b" with messages 1..STORED each, then `gaps` of "a" deleted from LMDB."""
    with tempfile.TemporaryDirectory() as name:
        path = Path(name)
        with LmdbStore(path) as store:
            for channel in CHANNELS:
                store.ensure_channel(channel)
                store.append([NewMessage(channel, f"{channel}{i}".encode()) for i in range(1, STORED + 1)])
        env = lmdb.open(str(path / "msgs"), max_dbs=4)
        with env.begin(write=True, db=env.open_db(b"messages")) as txn:
            cursor = txn.cursor()
            assert cursor.first()
            channel_id = MSG_KEY.unpack(cursor.key())[0]  # "a": the first key of the file
            for seq in gaps:
                assert txn.delete(MSG_KEY.pack(channel_id, seq))
        env.close()
        with LmdbStore(path, verify="quick") as store:
            yield store


operations = st.lists(
    st.one_of(
        st.tuples(st.just("read"), st.sampled_from(CHANNELS), st.integers(1, STORED + 40), st.integers(1, 25)),
        st.tuples(
            st.just("read_many"),
            st.sampled_from(CHANNELS),
            st.lists(st.integers(1, STORED + 40), min_size=1, max_size=8, unique=True).map(sorted),
        ),
        st.tuples(st.just("forget")),
        # A commit of `count` messages, handed over, then released with a reader `behind` them or not.
        st.tuples(st.just("append"), st.sampled_from(CHANNELS), st.integers(1, 12), st.integers(0, 20)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(gaps=st.sets(st.integers(2, STORED - 1), max_size=6), ops=operations, generation=st.sampled_from([8, 30, 8192]))
@example(gaps={5}, ops=[("read", "a", 1, 10), ("read", "a", 12, 10), ("read", "a", 1, 20)], generation=8192)
@example(gaps={5}, ops=[("read", "a", 1, 25), ("read", "a", 10, 5), ("read_many", "a", [4, 5, 6, 30])], generation=8192)
def test_the_reader_answers_as_the_store_does(gaps: set[int], ops: list[tuple[object, ...]], generation: int) -> None:
    with store_with_gaps(gaps) as store, pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader_module, "_GENERATION", generation)  # small ones: runs dropped and rotated
        reader = MessageReader(store)
        for op in ops:
            if op[0] == "read":
                _, channel, start, count = op
                assert isinstance(channel, str) and isinstance(start, int) and isinstance(count, int)
                assert list(reader.read(channel, start, count)) == store.read(channel, start, count), op
            elif op[0] == "read_many":
                _, channel, seqs = op
                assert isinstance(channel, str) and isinstance(seqs, list)
                assert reader.read_many(channel, seqs) == store.get_many(channel, seqs), op
            elif op[0] == "append":
                _, channel, count, behind = op
                assert isinstance(channel, str) and isinstance(count, int) and isinstance(behind, int)
                payloads = [b"new%d" % i for i in range(count)]
                result = store.append([NewMessage(channel, data) for data in payloads])
                appended = [
                    Message(seq, ts, channel, "", data)
                    for (seq, ts), data in zip(result.assigned, payloads, strict=True)
                ]
                reader.hold_appended(channel, appended)
                assert list(reader.read(channel, appended[0].seq, count)) == appended
                reader.release_appended(channel, [appended[0].seq - 1 - behind])
            else:
                reader.forget()


def test_a_backlog_read_side_by_side_is_read_from_the_store_once() -> None:
    """Ten subscriptions reading one backlog window by window: each window is read and checked once."""
    with store_with_gaps(set()) as store, pytest.MonkeyPatch.context() as patch:
        reads: list[tuple[str, int, int]] = []
        read = store.read

        def counted(channel: str, start: int, count: int) -> list[Message]:
            reads.append((channel, start, count))
            return read(channel, start, count)

        patch.setattr(store, "read", counted)
        reader = MessageReader(store)
        for start in range(1, STORED + 1, 20):
            for _ in range(10):
                assert [m.seq for m in reader.read("a", start, 20)] == list(range(start, start + 20))
        assert reads == [("a", 1, 20), ("a", 21, 20), ("a", 41, 20)]
