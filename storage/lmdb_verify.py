"""Verifying the LMDB store: the files before anything is opened (whole, none missing that the others
show existed, the journal files as long as they were), and the messages (every checksum with
`verify_on_start = "full"`, each channel's first and last with "quick", any time with
`scan_messages`). Damage found is raised or returned, never passed over."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import cast

import lmdb

from storage.codec import MSG_KEY, U32, U64, decode_lost, in_spans, key_seq, lost_key, value_intact
from storage.environment import Environment
from storage.errors import DamagedStoreError
from storage.integrity import Damage, is_empty_or_missing, lmdb_file_problem
from storage.records import ChannelInfo
from storage.state_walk import WalkAhead, walk_unless_sealed


def check_files(
    msgs_dir: Path, state_dir: Path, journals: list[Path], verify: str, state_walk: WalkAhead | None = None
) -> None:
    """Before opening: each LMDB file whole (and, with "full" for the messages, its structure), and no
    store whose message file is gone while the others hold data. Raises DamagedStoreError naming the
    file. `state_walk`: the state file's structure walk, begun earlier."""
    msgs_data, state_data = msgs_dir / "data.mdb", state_dir / "data.mdb"

    @functools.cache
    def walk(env_dir: Path) -> list[str]:
        """The structure walk of an environment, once (both the length check and the structure check
        may want it)."""
        if state_walk is not None and state_walk.env_dir == env_dir:
            return state_walk.problems()
        return walk_unless_sealed(env_dir)

    for data in (msgs_data, state_data):
        if not is_empty_or_missing(data):
            problem = lmdb_file_problem(data, functools.partial(walk, data.parent))
            if problem is not None:
                raise DamagedStoreError(f"{data} {problem}")
    if is_empty_or_missing(msgs_data):
        holding = [str(p) for p in (state_data, *journals) if not is_empty_or_missing(p)]
        if holding:
            raise DamagedStoreError(
                f"{msgs_data} is {'empty' if msgs_data.exists() else 'missing'}, but other files of the store "
                f"hold data ({', '.join(holding)}): the channels and messages it held are gone"
            )
    for env_dir, check in ((state_dir, True), (msgs_dir, verify == "full")):
        if check and not is_empty_or_missing(env_dir / "data.mdb"):
            problems = walk(env_dir)
            if problems:
                more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
                raise DamagedStoreError(f"{env_dir / 'data.mdb'} is damaged: {problems[0]}{more}")


def check_against_meta(msgs: Environment, state_data: Path, journals: list[Path]) -> None:
    """Once the message environment is open: a store it says exists has its state file, and its journal
    files exist and are at least as long as its last checkpoint recorded."""
    meta = msgs.dbs["meta"]
    msgs_data = msgs.path / "data.mdb"

    def get(key: bytes) -> bytes | memoryview | None:
        return msgs.read(lambda txn: txn.get(key, db=meta))

    if get(b"cluster_id") is None:
        return
    if is_empty_or_missing(state_data):
        raise DamagedStoreError(
            f"{state_data} is {'empty' if state_data.exists() else 'missing'}: the subscriptions, their "
            "positions and unacknowledged messages, and the clients it held are gone"
        )
    schema = get(b"schema_version")
    if schema is None or U32.unpack(schema)[0] < 2:
        return  # journal sizes are recorded from schema 2 on
    sizes = get(b"journal_sizes")
    known = [U64.unpack_from(sizes, 8 * i)[0] for i in range(len(journals))] if sizes else [0] * len(journals)
    for journal, size in zip(journals, known, strict=True):
        if not journal.exists():
            raise DamagedStoreError(
                f"{journal} is missing: it held the acknowledged messages not yet copied into {msgs_data}"
            )
        if journal.stat().st_size < size:
            raise DamagedStoreError(
                f"{journal} was cut short: it is {journal.stat().st_size} bytes long, but it was {size}; "
                f"it held the acknowledged messages not yet copied into {msgs_data}"
            )


def scan_messages(msgs: Environment, bounds: list[tuple[ChannelInfo, int]]) -> Damage:
    """Every message LMDB holds of each channel (`bounds`: its record and the last sequence copied into
    LMDB), checksum by checksum, and each channel's count against its record (sequences a repair
    recorded as lost are not missing). Messages only in the journal were verified when it was read."""
    return msgs.read(lambda txn: scan_snapshot(txn, msgs.dbs, bounds))


def scan_snapshot(
    txn: lmdb.Transaction, dbs: Mapping[str, lmdb._Database], bounds: list[tuple[ChannelInfo, int]]
) -> Damage:
    """`scan_messages` in one read transaction of the message environment (`dbs`: its databases)."""
    damage = Damage()
    db, meta = dbs["messages"], dbs["meta"]
    cursor = txn.cursor(db=db)
    for info, in_lmdb in bounds:
        cid, last = info.channel_id, min(in_lmdb, info.last_seq)
        if last < info.first_seq:
            continue
        end, present, bad = MSG_KEY.pack(cid, last), 0, []
        if cursor.set_range(MSG_KEY.pack(cid, info.first_seq)):
            for key, value in cast("Iterator[tuple[bytes, bytes]]", cursor.iternext()):
                if key > end:
                    break
                present += 1
                if len(key) != MSG_KEY.size:
                    damage.problems.append(f"channel {info.name!r}: a message's key is damaged ({len(key)} bytes)")
                elif not value_intact(key, value):
                    bad.append(key_seq(key))
        if bad:
            damage.damaged[info.name] = set(bad)
        expected = info.msgs - (info.last_seq - last)  # the rest is in the journal
        if present != expected:
            lost = decode_lost(txn.get(lost_key(cid), db=meta))
            gone = {
                seq
                for seq in range(info.first_seq, last + 1)
                if not in_spans(seq, lost) and txn.get(MSG_KEY.pack(cid, seq), db=db) is None
            }
            if gone:
                damage.missing[info.name] = gone
            else:
                damage.problems.append(
                    f"channel {info.name!r}: its record counts {expected} messages, but {present} are stored"
                )
    return damage


def channel_ends(msgs: Environment, bounds: list[tuple[ChannelInfo, int]]) -> Damage:
    """Each channel's first and last message as LMDB holds them (the quick check at open)."""
    damage = Damage()
    db = msgs.dbs["messages"]

    def check(txn: lmdb.Transaction) -> None:
        cursor = txn.cursor(db=db)
        for info, in_lmdb in bounds:
            cid = info.channel_id
            if not info.msgs or in_lmdb < info.first_seq:
                continue
            ends = []
            if cursor.set_range(MSG_KEY.pack(cid, info.first_seq)):
                ends.append((cursor.key(), cursor.value()))
            past = cursor.set_range(MSG_KEY.pack(cid, in_lmdb + 1))
            if cursor.prev() if past else cursor.last():
                ends.append((cursor.key(), cursor.value()))
            for key, value in ends:
                if len(key) != MSG_KEY.size:
                    damage.problems.append(f"channel {info.name!r}: a message's key is damaged ({len(key)} bytes)")
                elif MSG_KEY.unpack(key)[0] != cid:
                    damage.problems.append(f"channel {info.name!r}: none of its messages are stored")
                elif not value_intact(key, value):
                    damage.damaged.setdefault(info.name, set()).add(key_seq(key))

    msgs.read(check)
    return damage
