"""Benchmark of the LMDB store: group-commit append throughput and restart recovery.

    python bench/storage.py [--quick] [--json] [--dir DIR]

Figures (the last line with --json is one JSON object with these keys):
- append_batch1000_msgs_per_s: 128 B messages appended 1000 per call, one fsynced transaction per call
  (what the server's group commit does under load); raw_lmdb_batch1000_msgs_per_s is plain py-lmdb
  doing the same puts and fsyncs in the same run, the ceiling we are measured against.
- append_batch1_msgs_per_s: one message per call (one fsynced transaction each: the unbatched worst case).
- recover_s, recover_rss_mb: a fresh process opens a store of 1,000,000 messages and 100,000 pending
  entries over 1,000 subscriptions and rebuilds its state (messages stay in LMDB); bytes_per_pending
  is the memory that state costs per pending entry. --quick scales the store down and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lmdb
from rich.console import Console
from rich.progress import Progress

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ is first on sys.path and this file would shadow the `storage` package.
sys.path.insert(0, str(ROOT))

from bench.report import arguments, machine, print_report  # noqa: E402
from storage import LmdbStore, NewMessage, SaveSubscription, SetPending, SubscriptionRecord  # noqa: E402

PAYLOAD = os.urandom(128)


def bench_append(directory: Path, batch: int, total: int) -> float:
    with LmdbStore(directory) as store:
        store.ensure_channel("bench")
        messages = [NewMessage("bench", PAYLOAD)] * batch
        started = time.perf_counter()
        for _ in range(total // batch):
            store.append(messages)
        return (total // batch) * batch / (time.perf_counter() - started)


def bench_raw_lmdb(directory: Path, batch: int, total: int) -> float:
    env = lmdb.open(str(directory), map_size=1 << 30, max_dbs=2)
    db = env.open_db(b"messages")
    key = struct.Struct(">IQ")
    seq = 0
    started = time.perf_counter()
    for _ in range(total // batch):
        items = []
        for _ in range(batch):
            seq += 1
            items.append((key.pack(1, seq), PAYLOAD))
        with env.begin(write=True, db=db) as txn:
            txn.cursor().putmulti(items)
    rate = seq / (time.perf_counter() - started)
    env.close()
    return rate


def build_recovery_store(directory: Path, messages: int, subs: int, pending: int, progress: Progress) -> None:
    with LmdbStore(directory) as store:
        store.ensure_channel("big")
        task = progress.add_task("building the store", total=messages + pending)
        batch = [NewMessage("big", PAYLOAD)] * 10_000
        for done in range(0, messages, len(batch)):
            store.append(batch[: min(len(batch), messages - done)])
            progress.advance(task, min(len(batch), messages - done))
        per_sub = pending // subs
        for sub_id in range(1, subs + 1):
            record = SubscriptionRecord(
                sub_id,
                "big",
                f"client-{sub_id % 50}",
                f"_INBOX.{sub_id}",
                f"_ACK.{sub_id}",
                30_000,
                1024,
                durable_name=f"d{sub_id}",
                is_durable=True,
                last_sent=messages,
            )
            first = messages - per_sub * 3
            updates: list[Any] = [SaveSubscription(record)]
            updates += [SetPending(sub_id, first + 3 * i, 1 + i % 3) for i in range(per_sub)]
            store.apply(updates)
            progress.advance(task, per_sub)
        progress.remove_task(task)


RECOVER_CHILD = """
import json, resource, sys, time
import psutil
sys.path.insert(0, sys.argv[2])
from storage import LmdbStore
proc = psutil.Process()
base = proc.memory_info().rss
started = time.perf_counter()
store = LmdbStore(sys.argv[1])
state = store.recover()
elapsed = time.perf_counter() - started
rss = proc.memory_info().rss
pending = sum(len(s.pending) for s in state.subscriptions)
print(json.dumps({"recover_s": elapsed, "rss": rss, "base_rss": base, "pending": pending,
                  "subscriptions": len(state.subscriptions), "messages": sum(c.msgs for c in state.channels)}))
"""


def bench_recovery(directory: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", RECOVER_CHILD, str(directory), str(ROOT)], capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def main() -> int:
    parser = arguments(__doc__, quick="a smaller run, under 30 s")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the stores (default: a temp dir)")
    args = parser.parse_args()
    console = Console(stderr=args.json)

    scale = "quick" if args.quick else "full"
    messages, subs, pending = (200_000, 200, 20_000) if args.quick else (1_000_000, 1_000, 100_000)
    batched_total, single_total = (200_000, 2_000) if args.quick else (1_000_000, 5_000)

    base = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=args.dir))
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("append throughput", total=4)
            raw = bench_raw_lmdb(base / "raw", 1000, batched_total)
            progress.advance(task)
            batch1000 = bench_append(base / "b1000", 1000, batched_total)
            progress.advance(task)
            batch1 = bench_append(base / "b1", 1, single_total)
            progress.advance(task)
            build_recovery_store(base / "recover", messages, subs, pending, progress)
            progress.advance(task)
        rec = bench_recovery(base / "recover")
    finally:
        shutil.rmtree(base, ignore_errors=True)

    rss_mb = rec["rss"] / 2**20
    budget_mb = 100 + 150 * rec["pending"] / 2**20
    result = {
        "scale": scale,
        "messages": rec["messages"],
        "pending": rec["pending"],
        "subscriptions": rec["subscriptions"],
        "append_batch1000_msgs_per_s": round(batch1000),
        "raw_lmdb_batch1000_msgs_per_s": round(raw),
        "append_vs_raw_lmdb": round(batch1000 / raw, 3),
        "append_batch1_msgs_per_s": round(batch1),
        "recover_s": round(rec["recover_s"], 3),
        "recover_rss_mb": round(rss_mb, 1),
        "recover_rss_budget_mb": round(budget_mb, 1),
        "bytes_per_pending": round((rec["rss"] - rec["base_rss"]) / max(rec["pending"], 1), 1),
        "machine": machine(),
    }

    rows = [
        ("append, 1000 per batch (msgs/s)", f"{batch1000:,.0f}", ">= 300,000"),
        ("raw py-lmdb, same batches (msgs/s)", f"{raw:,.0f}", "peer"),
        ("append, 1 per batch (msgs/s)", f"{batch1:,.0f}", ""),
        ("recovery (s)", f"{rec['recover_s']:.3f}", "<= 2"),
        ("RSS after recovery (MB)", f"{rss_mb:.1f}", f"<= {budget_mb:.1f}"),
        ("recovered state per pending entry (B)", f"{result['bytes_per_pending']}", ""),
    ]
    title = f"storage benchmark ({scale}: {rec['messages']:,} messages, {rec['pending']:,} pending)"
    print_report(console, title, rows, result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
