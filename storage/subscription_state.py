"""The subscription state of the LMDB store: subscriptions, last-sent positions, pending entries (key:
sub id, seq) and clients, in the `state/` environment.

It has an environment of its own so that acknowledgement bookkeeping never queues behind message
checkpoints, nor the other way round. That environment commits without the extra meta-page sync:
integrity is kept, and a machine crash can undo at most the last commit, which only causes a
redelivery (see the durability contract in storage/base.py). Pending entries reference sequences
that were stored before they were delivered, so no transaction ever spans both environments.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import attrs
import lmdb

from storage.codec import NAKED_PENDING, PENDING_KEY, U32, U64, decode_record, encode_record
from storage.environment import Environment, delete_prefix, put_again
from storage.errors import DamagedStoreError, IntegrityError
from storage.records import (
    ChannelInfo,
    ClearPending,
    ClearPendingRun,
    ClientRecord,
    DeleteClient,
    DeleteSubscription,
    RecoveredState,
    RecoveredSubscription,
    SaveClient,
    SaveSubscription,
    ServerInfo,
    SetLastSent,
    SetPending,
    SetPendingRun,
    SubscriptionRecord,
    SubUpdate,
)

DATABASES = ["meta", "subs", "lastsent", "pending", "clients"]
_FIRST_ATTEMPT = U32.pack(1)


class SubscriptionState:
    def __init__(self, env: Environment) -> None:
        self._env = env
        self._next_sub_id = env.read(self._highest_sub_id) + 1

    def _highest_sub_id(self, txn: lmdb.Transaction) -> int:
        stored = txn.get(b"next_sub_id", db=self._env.dbs["meta"])
        highest = U64.unpack(stored)[0] - 1 if stored else 0
        cursor = txn.cursor(db=self._env.dbs["subs"])
        if cursor.last():
            highest = max(highest, U64.unpack(cursor.key())[0])
        return highest

    def new_subscription_id(self) -> int:
        with self._env.write_lock:
            sub_id = self._next_sub_id
            self._next_sub_id += 1
            return sub_id

    def apply(self, updates: Iterable[SubUpdate]) -> None:
        dbs = self._env.dbs
        batch = list(updates)
        if not batch:
            return

        def write(txn: lmdb.Transaction) -> None:
            highest = 0
            pending_db = dbs["pending"]
            for update in batch:
                if isinstance(update, SetPendingRun):
                    first, sub_id, pack_key = _FIRST_ATTEMPT, update.sub_id, PENDING_KEY.pack
                    txn.cursor(db=pending_db).putmulti([(pack_key(sub_id, seq), first) for seq in update.seqs])
                elif isinstance(update, ClearPendingRun):
                    sub_id, pack_key, delete = update.sub_id, PENDING_KEY.pack, txn.delete
                    for seq in update.seqs:
                        delete(pack_key(sub_id, seq), db=pending_db)
                elif isinstance(update, SetPending):
                    value = (
                        NAKED_PENDING.pack(update.attempt, update.not_before_ns)
                        if update.not_before_ns
                        else U32.pack(update.attempt)
                    )
                    txn.put(PENDING_KEY.pack(update.sub_id, update.seq), value, db=dbs["pending"])
                elif isinstance(update, ClearPending):
                    txn.delete(PENDING_KEY.pack(update.sub_id, update.seq), db=dbs["pending"])
                elif isinstance(update, SetLastSent):
                    txn.put(U64.pack(update.sub_id), U64.pack(update.last_sent), db=dbs["lastsent"])
                elif isinstance(update, SaveSubscription):
                    key = U64.pack(update.record.sub_id)
                    put_again(txn, key, encode_record(update.record), dbs["subs"])
                    txn.put(key, U64.pack(update.record.last_sent), db=dbs["lastsent"])
                    highest = max(highest, update.record.sub_id)
                elif isinstance(update, DeleteSubscription):
                    key = U64.pack(update.sub_id)
                    txn.delete(key, db=dbs["subs"])
                    txn.delete(key, db=dbs["lastsent"])
                    delete_prefix(txn.cursor(db=dbs["pending"]), key)
                elif isinstance(update, SaveClient):
                    put_again(txn, update.record.client_id.encode(), encode_record(update.record), dbs["clients"])
                elif isinstance(update, DeleteClient):
                    txn.delete(update.client_id.encode(), db=dbs["clients"])
            if highest:
                stored = txn.get(b"next_sub_id", db=dbs["meta"])
                if stored is None or U64.unpack(stored)[0] <= highest:
                    txn.put(b"next_sub_id", U64.pack(highest + 1), db=dbs["meta"])

        with self._env.write_lock:
            self._env.write(write)

    def recover(self, server: ServerInfo, channels: list[ChannelInfo]) -> RecoveredState:
        dbs = self._env.dbs

        def load(txn: lmdb.Transaction) -> RecoveredState:
            clients = [decode_record(v, ClientRecord) for v in txn.cursor(db=dbs["clients"]).iternext(keys=False)]
            last_sent = {}
            for k, v in txn.cursor(db=dbs["lastsent"]).iternext():
                if len(k) != U64.size or len(v) != U64.size:
                    raise IntegrityError(f"position record of {len(k)}/{len(v)} bytes")
                last_sent[U64.unpack(k)[0]] = U64.unpack(v)[0]
            pending: dict[int, dict[int, int]] = {}
            naks: dict[int, dict[int, int]] = {}  # sub id -> seq -> not before (ns): nak'd with a delay
            unpack_key, unpack_attempt = PENDING_KEY.unpack, U32.unpack_from
            current_id, current = -1, {}
            k = b""
            try:  # free where nothing is wrong: this loop reads 100,000 entries at a restart
                for k, v in txn.cursor(db=dbs["pending"]).iternext():
                    sub_id, seq = unpack_key(k)
                    if sub_id != current_id:
                        current_id, current = sub_id, pending.setdefault(sub_id, {})
                    if len(v) == NAKED_PENDING.size:
                        attempt, not_before = NAKED_PENDING.unpack(v)
                        current[seq] = attempt
                        naks.setdefault(sub_id, {})[seq] = not_before
                    elif len(v) == U32.size:
                        current[seq] = unpack_attempt(v)[0]
                    else:
                        raise IntegrityError(f"pending entry {sub_id}/{seq}: value of {len(v)} bytes")
            except struct.error:  # only a key unpacks unchecked
                raise IntegrityError(f"pending entry with a key of {len(k)} bytes") from None
            subs = []
            for v in txn.cursor(db=dbs["subs"]).iternext(keys=False):
                record = decode_record(v, SubscriptionRecord)
                own = pending.get(record.sub_id, {})
                # A delivery's SetPending may have been committed without its SetLastSent.
                position = max(last_sent.get(record.sub_id, record.last_sent), max(own, default=0))
                recovered = attrs.evolve(record, last_sent=position)
                subs.append(RecoveredSubscription(recovered, own, naks.get(record.sub_id, {})))
            return RecoveredState(server, channels, clients, subs)

        try:
            return self._env.read(load)
        except DamagedStoreError:
            raise
        except IntegrityError as exc:  # a record that does not decode: the file is damaged
            raise DamagedStoreError(f"{self._env.path / 'data.mdb'}: {exc}") from exc
