"""`LmdbStore.load_channel`, the importer's bulk load: messages at their own sequences and timestamps,
a channel that starts past 1, keeps its last sequence with nothing left, has gaps; the store opens
again fully verified, and publishing goes on after the last sequence."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import LmdbStore, Message, NewMessage


def messages(channel: str, seqs: list[int]) -> list[Message]:
    return [Message(seq, 1_000 + seq, channel, "reply" if seq % 2 else "", b"m%d" % seq) for seq in seqs]


def test_a_loaded_channel_is_a_channel_like_any_other(tmp_path: Path) -> None:
    with LmdbStore(tmp_path) as store:
        info = store.load_channel("loaded", messages("loaded", [5, 6, 7, 9]), last_seq=9, batch_bytes=40)
        assert (info.first_seq, info.last_seq, info.msgs, info.last_timestamp_unix_ns) == (5, 9, 4, 1_009)
        empty = store.load_channel("emptied", iter([]), last_seq=41)
        assert (empty.first_seq, empty.last_seq, empty.msgs) == (42, 41, 0)
    with LmdbStore(tmp_path, verify="full") as store:
        found = store.read("loaded", 1, 10)
        assert [(m.seq, m.timestamp_unix_ns, m.reply, m.data) for m in found] == [
            (m.seq, m.timestamp_unix_ns, m.reply, m.data) for m in messages("loaded", [5, 6, 7, 9])
        ]
        result = store.append([NewMessage("loaded", b"next"), NewMessage("emptied", b"next")])
        assert [seq for seq, _ in result.assigned] == [10, 42]


def test_a_load_takes_new_channels_and_sequences_in_order_only(tmp_path: Path) -> None:
    with LmdbStore(tmp_path) as store:
        store.ensure_channel("there")
        with pytest.raises(ValueError, match="exists already"):
            store.load_channel("there", iter([]), last_seq=0)
        with pytest.raises(ValueError, match="message 3 after 4"):
            store.load_channel("backwards", messages("backwards", [4, 3]), last_seq=5)
        with pytest.raises(ValueError, match="past its end"):
            store.load_channel("past", messages("past", [1, 2]), last_seq=1)
