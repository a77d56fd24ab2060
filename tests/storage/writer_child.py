"""Child processes for the crash and disk-full tests (run with `python -m tests.storage.writer_child`).

`crash DIR SEED [nosync]`: appends batches forever, printing `committed <last seq>` after each append
returns (so every printed sequence was acknowledged); the parent SIGKILLs it at a random moment.
`nosync` opens the store with sync=False (`file_sync = false`). How often the store checkpoints its
journal into LMDB is drawn from SEED.

`fill DIR`: appends 64 KiB messages until the disk is full, then checks what it can without a
restart, reopens the store and checks again; prints one JSON object describing what happened.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from storage import (
    ChannelLimits,
    LmdbStore,
    NewMessage,
    SaveSubscription,
    SetLastSent,
    SetPending,
    StoreError,
    StoreLimits,
    SubscriptionRecord,
)

UNLIMITED = StoreLimits(channel=ChannelLimits())  # so that every message written is still there to check


def payload(seq: int) -> bytes:
    """The payload of message `seq`: deterministic, so the parent can check it byte for byte."""
    return (b"m%d:" % seq) * (1 + seq % 23)


def crash(directory: Path, seed: int, sync: bool = True) -> None:
    rng = random.Random(seed)
    # Checkpoints from rare to constant, so kills land in journal writes, switches and LMDB commits.
    # "quick": the test opened this store, checked every message and closed it just before (after the
    # last kill); a full pass here too would read the whole, growing store once more each round.
    store = LmdbStore(
        directory,
        limits=UNLIMITED,
        sync=sync,
        verify="quick",
        checkpoint_bytes=rng.choice([16 << 10, 256 << 10, 8 << 20]),
        checkpoint_interval=rng.choice([0.005, 0.05, 1.0]),
    )
    store.ensure_channel("crash")
    info = store.channel_info("crash")
    assert info is not None
    print(f"start {info.last_seq + 1}", flush=True)
    sub = SubscriptionRecord(1, "crash", "writer", "_INBOX.in", "_INBOX.ack", 1000, 100)
    store.apply([SaveSubscription(sub)])
    while True:
        first = info.last_seq + 1
        count = rng.randint(1, 300)
        result = store.append([NewMessage("crash", payload(first + i)) for i in range(count)])
        assigned = [seq for seq, _ in result.assigned]
        assert assigned == list(range(first, first + count)), (assigned[:3], first)
        print(f"committed {assigned[-1]}", flush=True)
        store.apply([SetPending(1, assigned[-1], 1), SetLastSent(1, assigned[-1])])
        info = store.channel_info("crash")
        assert info is not None


def fill(directory: Path) -> None:
    report: dict[str, object] = {}
    store = LmdbStore(directory, map_size=1 << 20)
    store.ensure_channel("big")
    committed: list[int] = []
    try:
        for i in range(10_000):
            result = store.append([NewMessage("big", payload(i) + bytes(64 * 1024))])
            committed.extend(seq for seq, _ in result.assigned)
    except StoreError as exc:
        report["error_type"] = type(exc).__name__
        report["error"] = str(exc)
    report["committed"] = len(committed)
    report["readable_before_reopen"] = sum(1 for s in committed if store.get("big", s) is not None)
    try:
        store.append([NewMessage("big", bytes(256 * 1024))])
        report["second_append"] = "succeeded"
    except StoreError as exc:
        report["second_append"] = type(exc).__name__
    store.close()
    store = LmdbStore(directory, map_size=1 << 20)
    intact = 0
    for seq in committed:
        msg = store.get("big", seq)
        intact += msg is not None and msg.data[: len(payload(seq - 1))] == payload(seq - 1)
    report["intact_after_reopen"] = intact
    info = store.channel_info("big")
    report["last_seq_after_reopen"] = info.last_seq if info else None
    store.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "crash":
        crash(Path(sys.argv[2]), int(sys.argv[3]), sync=sys.argv[4:] != ["nosync"])
    elif sys.argv[1] == "fill":
        fill(Path(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
