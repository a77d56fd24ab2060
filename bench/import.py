"""`streaming-server import-stan` on a large nats-streaming-server store, against our own store's append
rate in the same run.

    python bench/import.py [--quick] [--json] [--writer peer|format]

The source is 10 channels x 100,000 messages of 200 bytes (quick: x 10,000), each channel with a
durable holding 1,000 pending messages. `--writer peer` (the default when the binary is found, from
`STAN_SERVER` or ../shared/peers/) has nats-streaming-server write it, published through it with the
file store's defaults; `--writer format` writes the same store with the format writer here (no server).
Figures (the last line with --json is one JSON object with these keys):
Each figure is the median of 3 rounds.
- import_msgs_per_s: messages over the importer's own time (reading, checking, decrypting nothing,
  writing our store, fsyncs included); import_command_s: the whole command, Python start-up included;
- append_msgs_per_s: `LmdbStore.append` of the same messages in batches of 1,000, one fsynced journal
  write per batch (what the server's group commit does for publishes), in this process;
  import_vs_append: their ratio (the target is >= 0.5);
- import_peak_rss_mb and small_import_peak_rss_mb: the importer's peak resident memory on this store
  and on one a tenth its size (one of its channels): the import streams, so the two should be about
  the same.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import publish_pipelined  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402
from storage import LmdbStore, NewMessage  # noqa: E402
from streaming.client import StartPosition, connect  # noqa: E402
from streaming.stan_import.spb.store_pb2 import ClientInfo, ServerInfo, SubState, SubStateUpdate  # noqa: E402
from streaming.wire.stan_pb.protocol_pb2 import MsgProto  # noqa: E402

CHANNELS = 10  # the small store has one
PAYLOAD = bytes(range(200))
PENDING = 1_000
ROUNDS = 3  # imports and appends, each figure the median


def stan_binary() -> str | None:
    found = os.environ.get("STAN_SERVER") or str(ROOT.parent / "shared/peers/nats-streaming-server")
    return found if os.access(found, os.X_OK) else None


# -- the source store --------------------------------------------------------------------------------


async def _fill(port: int, per_channel: int, channels: int) -> None:
    async with connect("test-cluster", "bench-import", port=port, request_timeout_s=30) as sc:
        for c in range(channels):
            channel = f"import.ch{c}"
            await publish_pipelined(sc, channel, per_channel, PAYLOAD)
            await sc.wait_pub_acks()
            sub = await sc.open_subscription(
                channel, durable="d", start_at=StartPosition.FIRST, max_inflight=PENDING, manual_ack=True, ack_wait=600
            )
            for _ in range(PENDING):
                await sub.next_msg()  # left unacknowledged: pending in the store
            await sub.close()


def write_with_peer(binary: str, root: Path, per_channel: int, channels: int) -> None:
    port, http = peers.free_port(), peers.free_port()
    cmd = [binary, "-a", "127.0.0.1", "-p", str(port), "-m", str(http), "-st", "FILE", "--dir", str(root)]
    proc = subprocess.Popen([*cmd, "-cid", "test-cluster"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        peers.wait_port(port, proc)
        for attempt in range(20):  # it answers STAN connects a moment after its port opens
            try:
                trio.run(_fill, port, per_channel, channels)
                break
            except Exception:
                if attempt == 19:
                    raise
                time.sleep(0.25)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _record(payload: bytes, kind: int = 0) -> bytes:
    return struct.pack("<II", kind << 24 | len(payload), zlib.crc32(payload)) + payload


def write_with_format(root: Path, per_channel: int, channels: int) -> None:
    """The same store, written in nats-streaming-server's file format without the server."""
    version = struct.pack("<I", 1)
    root.mkdir(parents=True)
    info = ServerInfo(ClusterID="test-cluster", Publish="_STAN.pub.test-cluster", AcksSubs="_STAN.ack.test-cluster")
    (root / "server.dat").write_bytes(version + _record(info.SerializeToString()))
    client = ClientInfo(ID="bench-import", HbInbox="_INBOX.bench")
    (root / "clients.dat").write_bytes(version + _record(client.SerializeToString(), 1))
    started = time.time_ns()
    for c in range(channels):
        channel = root / f"import.ch{c}"
        channel.mkdir()
        with (channel / "msgs.1.dat").open("wb") as dat, (channel / "msgs.1.idx").open("wb") as idx:
            dat.write(version)
            idx.write(version)
            offset = 4
            for seq in range(1, per_channel + 1):
                ts = started + seq
                body = MsgProto(sequence=seq, subject=channel.name, data=PAYLOAD, timestamp=ts).SerializeToString()
                dat.write(_record(body))
                entry = struct.pack("<QQqI", seq, offset, ts, len(body))
                idx.write(entry + struct.pack("<I", zlib.crc32(entry)))
                offset += 8 + len(body)
        sub = SubState(ID=1, clientID="bench-import", inbox="_INBOX.x", ackInbox="_INBOX.y", maxInFlight=PENDING)
        sub.ackWaitInSecs, sub.durableName, sub.isDurable = 600, "d", True
        records = [_record(sub.SerializeToString(), 1)]
        records += [_record(SubStateUpdate(ID=1, seqno=s).SerializeToString(), 5) for s in range(1, PENDING + 1)]
        (channel / "subs.dat").write_bytes(version + b"".join(records))


# -- the figures ---------------------------------------------------------------------------------------


# Runs the import as a child of its own, so that the peak RSS of its children is the import's alone.
_MEASURED = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "raise SystemExit(done.returncode)"
)


def run_import(source: Path, target: Path) -> tuple[float, float, float]:
    """(importer's own seconds, the command's seconds, its peak RSS in MB)."""
    command = [sys.executable, "-m", "streaming", "import-stan", str(source), "--dir", str(target)]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURED, *command], capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"import failed: {done.stderr}")
    own = re.search(r" in ([\d.]+) s", done.stdout)
    peak = re.search(r"peak_rss_kb (\d+)", done.stderr)
    assert own and peak, (done.stdout, done.stderr)
    return float(own.group(1)), elapsed, int(peak.group(1)) / 1024


def append_rate(directory: Path, total: int) -> float:
    with LmdbStore(directory) as store:
        for c in range(CHANNELS):
            store.ensure_channel(f"import.ch{c}")
        batches = [[NewMessage(f"import.ch{c}", PAYLOAD)] * 1000 for c in range(CHANNELS)]
        started = time.perf_counter()
        for i in range(total // 1000):
            store.append(batches[i % CHANNELS])
        return (total // 1000) * 1000 / (time.perf_counter() - started)


def main() -> None:
    parser = arguments(__doc__, quick="10 x 10,000 messages (under a minute)")
    parser.add_argument("--writer", choices=["peer", "format"], help="who writes the source store")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    per_channel = 10_000 if args.quick else 100_000
    binary = stan_binary()
    writer = args.writer or ("peer" if binary else "format")
    if writer == "peer" and binary is None:
        raise SystemExit("nats-streaming-server not found: set STAN_SERVER, or use --writer format")
    total = CHANNELS * per_channel
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "writer": writer}
    work = Path(tempfile.mkdtemp(prefix="bench-import-"))
    try:
        with progress(console) as bar:
            task = bar.add_task(f"writing {total:,} messages with the {writer} writer", total=5)
            for name, channels in (("large", CHANNELS), ("small", 1)):
                if writer == "peer":
                    assert binary is not None
                    write_with_peer(binary, work / name, per_channel, channels)
                else:
                    write_with_format(work / name, per_channel, channels)
                bar.advance(task)
            bar.update(task, description="importing the large store (3 times)")
            runs = []
            for i in range(ROUNDS):
                runs.append(run_import(work / "large", work / f"large-ours-{i}"))
                shutil.rmtree(work / f"large-ours-{i}")
            own_s, command_s, rss = sorted(runs)[ROUNDS // 2]
            bar.advance(task)
            bar.update(task, description="importing the small store")
            _, _, small_rss = run_import(work / "small", work / "small-ours")
            bar.advance(task)
            bar.update(task, description=f"appending {total:,} messages to our store (3 times)")
            rates = []
            for i in range(ROUNDS):
                rates.append(append_rate(work / f"append-{i}", total))
                shutil.rmtree(work / f"append-{i}")
            appended = sorted(rates)[ROUNDS // 2]
            bar.advance(task)
        stored = sum(f.stat().st_size for f in (work / "large").rglob("*") if f.is_file())
        result |= {
            "messages": total,
            "source_mb": round(stored / 2**20, 1),
            "import_s": own_s,
            "import_command_s": round(command_s, 2),
            "import_msgs_per_s": round(total / own_s),
            "append_msgs_per_s": round(appended),
            "import_vs_append": round(total / own_s / appended, 2),
            "import_peak_rss_mb": round(rss, 1),
            "small_import_peak_rss_mb": round(small_rss, 1),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [(key, f"{value}", "") for key, value in result.items() if key not in ("machine",)]
    print_report(console, f"import-stan of {total:,} messages ({result['scale']})", rows, result, args.json)


if __name__ == "__main__":
    main()
