"""How subs.dat and clients.dat are replayed, record type by record type, as the server replays them:
a sent record moves last-sent and adds a pending sequence, an ack only removes it (last-sent stays),
an update replaces the state and keeps the pending set, a new record starts afresh, a delete drops it;
clients are added and deleted; an unknown record type is damage."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from streaming.stan_import.filestore import FileStoreReader
from streaming.stan_import.framing import DamagedRecordError
from streaming.stan_import.model import ReadOptions
from streaming.stan_import.spb.store_pb2 import ClientDelete, ClientInfo, SubState, SubStateDelete, SubStateUpdate
from tests.stan_import.support import copy

NEW, UPDATE, DELETE, ACK, SENT = 1, 2, 3, 4, 5


def typed(records: list[tuple[int, bytes]]) -> bytes:
    out = [struct.pack("<I", 1)]
    for kind, payload in records:
        out.append(struct.pack("<II", kind << 24 | len(payload), zlib.crc32(payload)) + payload)
    return b"".join(out)


def state(sub_id: int, **fields: object) -> bytes:
    found = SubState(ID=sub_id, clientID="c1", inbox="_INBOX.i", ackInbox="_INBOX.a", maxInFlight=5, ackWaitInSecs=30)
    for name, value in fields.items():
        setattr(found, name, value)
    return found.SerializeToString()


def update(sub_id: int, seq: int) -> bytes:
    return SubStateUpdate(ID=sub_id, seqno=seq).SerializeToString()


def test_subscriptions_replay_as_the_server_replays_them(tmp_path: Path) -> None:
    source = copy("basic", tmp_path)
    (source / "orders.eu" / "subs.dat").write_bytes(
        typed(
            [
                (NEW, state(1, durableName="d", isDurable=True)),
                *[(SENT, update(1, seq)) for seq in (1, 2, 3, 4)],
                (ACK, update(1, 1)),
                (ACK, update(1, 4)),  # last-sent stays at 4
                (UPDATE, state(1, durableName="d", isDurable=True, isClosed=True, lastSent=2)),  # pending kept
                (SENT, update(1, 3)),  # a redelivery: last-sent does not go back
                (NEW, state(2, durableName="e", isDurable=True)),
                (SENT, update(2, 7)),
                (NEW, state(2, durableName="e", isDurable=True)),  # afresh: its pending set empties
                (NEW, state(3)),
                (SENT, update(3, 9)),
                (DELETE, SubStateDelete(ID=3).SerializeToString()),
                (SENT, update(42, 5)),  # an unknown subscription's record is ignored
            ]
        )
    )
    store = FileStoreReader(source, ReadOptions()).read()
    subs = {s.state.ID: s for s in next(c for c in store.channels if c.name == "orders.eu").subscriptions}
    assert set(subs) == {1, 2}
    assert subs[1].pending == {2, 3} and subs[1].state.lastSent == 3 and subs[1].state.isClosed
    assert subs[2].pending == set() and subs[2].state.lastSent == 0


def test_clients_replay_and_unknown_records_are_damage(tmp_path: Path) -> None:
    source = copy("basic", tmp_path)
    add = [(1, ClientInfo(ID=name, HbInbox=f"_INBOX.{name}").SerializeToString()) for name in ("a", "b", "c")]
    gone = (2, ClientDelete(ID="b").SerializeToString())
    (source / "clients.dat").write_bytes(typed([*add, gone, (1, add[0][1])]))
    store = FileStoreReader(source, ReadOptions()).read()
    assert sorted(store.clients) == ["a", "c"]
    (source / "clients.dat").write_bytes(typed([*add, (7, b"")]))
    with pytest.raises(DamagedRecordError, match="unknown client record type 7"):
        FileStoreReader(source, ReadOptions()).read()
    (source / "clients.dat").write_bytes(typed(add))
    (source / "audit" / "subs.dat").write_bytes(typed([(NEW, b"\xff\xff")]))
    with pytest.raises(DamagedRecordError, match="not a valid SubState"):
        FileStoreReader(source, ReadOptions()).read()
