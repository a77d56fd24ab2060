"""Soak: ~1,000 clients busy at once against one server for N minutes (loopback only, bounded), with a
report every minute and, at the end, every acknowledged message accounted for.

    python bench/soak.py --minutes 20 [--clients 1000] [--plot soak.png] [--json]

Three processes besides the server: this one (reports: server RSS and open descriptors, redeliveries
from /metrics), the load (publishers; plain, durable and queue subscribers acking after random delays,
a few of them past AckWait; clients that drop their connection and come back; one durable subscriber
that stalls, never acking), and a probe (publish -> deliver latency of a lightly used channel, and the
round trip of a NATS PING, which the server answers on its event loop: its tail is the loop's stalls).

At the end the publishers stop; every message they got a PubAck for must be stored; every durable
subscriber (the reconnecting ones too) and every queue group must have received every message of its
channel; every plain subscriber every message published while it was subscribed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CID = "test-cluster"
CHANNELS = 20
ACK_WAIT = 5.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the load -------------------------------------------------------------------------------------


class _Seen:
    """Which sequences of one channel a subscriber (or group) received: a bitmap."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.first = 0  # the first sequence it was subscribed for

    def add(self, seq: int) -> None:
        byte, bit = divmod(seq, 8)
        if byte >= len(self.bits):
            self.bits.extend(bytes(byte - len(self.bits) + 4096))
        self.bits[byte] |= 1 << bit

    def missing(self, first: int, last: int) -> list[int]:
        return [s for s in range(first, last + 1) if not (s // 8 < len(self.bits) and self.bits[s // 8] >> (s % 8) & 1)]


async def _load(port: int, clients: int, minutes: float, out: Path) -> None:
    import trio

    from streaming.client import StanError, StartPosition, connect
    from streaming.client.nats_conn import ConnectionClosedError

    rng = random.Random(20261124)
    channels = [f"soak.{i}" for i in range(CHANNELS)]
    share = max(1, (clients - 41) // 10)  # ten parts: 1 publishers, 3 plain, 3 durable, 3 queue (+ reconnectors)
    acked: dict[str, set[int]] = {c: set() for c in channels}
    durable_seen: list[tuple[str, _Seen]] = []
    plain_seen: list[tuple[str, _Seen]] = []
    group_seen: dict[str, _Seen] = {c: _Seen() for c in channels}
    counters = {"published": 0, "refused": 0, "received": 0, "acks": 0, "reconnects": 0, "client_errors": 0}
    stopping = trio.Event()

    async def publisher(index: int) -> None:
        channel = channels[index % CHANNELS]
        n = 0
        async with connect(CID, f"pub-{index}", port=port, reconnect_wait_s=0.2) as sc:
            while not stopping.is_set():
                futures = []
                for _ in range(2):
                    n += 1
                    futures.append((n, await sc.publish_async(channel, b"%d:%d" % (index, n))))
                for number, future in futures:
                    try:
                        await future.wait()
                    except StanError:
                        counters["refused"] += 1
                        continue
                    acked[channel].add(index * 10_000_000 + number)
                    counters["published"] += 1
                await trio.sleep(rng.uniform(1.5, 2.5))

    async def ack_later(msg: Any, delay: float) -> None:
        await trio.sleep(delay)
        msg.ack()
        counters["acks"] += 1

    async def plain(index: int) -> None:
        channel = channels[index % CHANNELS]
        seen = _Seen()
        plain_seen.append((channel, seen))
        async with connect(CID, f"plain-{index}", port=port) as sc, sc.subscribe(channel) as sub:
            seen.first = -1
            async for msg in sub:
                if seen.first < 0:
                    seen.first = msg.seq
                seen.add(msg.seq)
                counters["received"] += 1

    async def durable(index: int, *, reconnect: bool = False) -> None:
        channel = channels[index % CHANNELS]
        seen = _Seen()
        seen.first = 1
        durable_seen.append((channel, seen))
        name = f"{'re' if reconnect else 'dur'}-{index}"
        while True:
            async with connect(CID, name, port=port, reconnect_wait_s=0.2) as sc:
                sub_cm = sc.subscribe(
                    channel,
                    durable="d",
                    manual_ack=True,
                    ack_wait=ACK_WAIT,
                    start_at=StartPosition.FIRST,
                    close_on_exit=True,
                )
                async with sub_cm as sub:
                    with trio.move_on_after(rng.uniform(20, 60) if reconnect else math.inf):
                        async with trio.open_nursery() as nursery:
                            async for msg in sub:
                                seen.add(msg.seq)
                                counters["received"] += 1
                                if rng.random() < 0.002:  # now and then, past AckWait: it comes back
                                    continue
                                nursery.start_soon(ack_later, msg, rng.expovariate(1 / 0.05))
            counters["reconnects"] += 1
            await trio.sleep(rng.uniform(0.5, 3))

    async def queue_member(index: int) -> None:
        channel = channels[index % CHANNELS]
        seen = group_seen[channel]
        async with connect(CID, f"queue-{index}", port=port) as sc:
            sub_cm = sc.subscribe(
                channel,
                queue="workers",
                durable="q",
                manual_ack=True,
                ack_wait=ACK_WAIT,
                start_at=StartPosition.FIRST,
                close_on_exit=True,
            )
            async with sub_cm as sub:
                async for msg in sub:
                    seen.add(msg.seq)
                    counters["received"] += 1
                    msg.ack()
                    counters["acks"] += 1

    async def stalled() -> None:
        async with connect(CID, "stalled", port=port) as sc:
            sub = await sc.open_subscription(
                channels[0],
                durable="stuck",
                manual_ack=True,
                ack_wait=ACK_WAIT,
                max_inflight=50,
                suppress_copies=False,
            )
            async for _ in sub:  # never acks: redelivered every AckWait, MaxInflight holds the rest
                pass

    async def watch_stop() -> None:
        await trio.sleep(minutes * 60)
        stopping.set()

    async def guarded(task: Any) -> None:
        """A client's errors count; at the end (its connection cancelled) they are expected."""
        try:
            await task()
        except (StanError, ConnectionClosedError, OSError, trio.BrokenResourceError) as exc:
            if not done.is_set():
                counters["client_errors"] += 1
                print(json.dumps({"client_error": repr(exc)}), flush=True)

    done = trio.Event()
    async with trio.open_nursery() as subs:
        for i in range(share * 3):
            subs.start_soon(guarded, partial(plain, i))
        for i in range(share * 3):
            subs.start_soon(guarded, partial(durable, i))
        for i in range(40):
            subs.start_soon(guarded, partial(durable, i, reconnect=True))
        for i in range(share * 3):
            subs.start_soon(guarded, partial(queue_member, i))
        subs.start_soon(guarded, stalled)
        await trio.sleep(5)  # everyone subscribed before anything is published
        async with trio.open_nursery() as pubs:
            pubs.start_soon(watch_stop)
            for i in range(share):
                pubs.start_soon(guarded, partial(publisher, i))

            async def report() -> None:
                while True:
                    print(json.dumps({"load": dict(counters)}), flush=True)
                    await trio.sleep(10)

            pubs.start_soon(report)
            await stopping.wait()
            pubs.cancel_scope.cancel()
        # Drain: what is still unacknowledged comes back within AckWait; then account for it all.
        last: dict[str, int] = {}
        async with connect(CID, "accountant", port=port) as sc:
            for channel in channels:
                stored: set[int] = set()
                async with sc.subscribe(channel, start_at=StartPosition.FIRST, max_inflight=100_000) as reader:
                    while True:
                        with trio.move_on_after(2) as idle:
                            msg = await reader.next_msg()
                        if idle.cancelled_caught:
                            break
                        index, number = msg.data.split(b":")
                        stored.add(int(index) * 10_000_000 + int(number))
                        last[channel] = max(last.get(channel, 0), msg.seq)
                lost = acked[channel] - stored
                if lost:
                    print(json.dumps({"lost": channel, "count": len(lost)}), flush=True)
                acked[channel] = set(sorted(lost)[:5])  # keep examples only
        deadline = trio.current_time() + 60
        while trio.current_time() < deadline:
            incomplete = sum(1 for channel, seen in durable_seen if seen.missing(1, last.get(channel, 0)))
            if not incomplete:
                break
            await trio.sleep(1)
        done.set()
        subs.cancel_scope.cancel()
    result = {
        "counters": counters,
        "acked_lost": sum(len(v) for v in acked.values()),
        "durables_incomplete": sum(1 for c, s in durable_seen if s.missing(1, last.get(c, 0))),
        "plain_incomplete": sum(1 for c, s in plain_seen if s.first > 0 and s.missing(s.first, last.get(c, 0))),
        "groups_incomplete": sum(1 for c, s in group_seen.items() if s.missing(1, last.get(c, 0))),
        "stored": sum(last.values()),
    }
    await trio.Path(out).write_text(json.dumps(result))


# -- the probe ------------------------------------------------------------------------------------


async def _probe(port: int, minutes: float) -> None:
    import trio

    from streaming.client import StanClient, Subscription, connect

    latencies: list[float] = []
    rtts: list[float] = []

    async def ping() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.receive_some(4096)
        await stream.send_all(b"CONNECT {}\r\n")
        while True:
            started = time.monotonic()
            await stream.send_all(b"PING\r\n")
            data = b""
            while b"PONG" not in data:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    raise EOFError("the server closed the probe's connection")
                data += chunk
                if b"PING" in chunk:  # the server's own keepalive: answered, or it closes us as stale
                    await stream.send_all(b"PONG\r\n")
            rtts.append(time.monotonic() - started)
            await trio.sleep(0.05)

    async def publish(pub: StanClient) -> None:
        while True:
            await pub.publish_async("soak.probe", str(time.monotonic()).encode())
            await trio.sleep(0.02)

    async def receive(sub: Subscription) -> None:
        async for msg in sub:
            latencies.append(time.monotonic() - float(msg.data))

    async def report() -> None:
        while True:
            await trio.sleep(10)
            window, latencies[:] = list(latencies), []
            round_trips, rtts[:] = list(rtts), []
            figures = {
                "latency_p50_ms": _percentile(window, 0.5) * 1000,
                "latency_p99_ms": _percentile(window, 0.99) * 1000,
                "ping_p99_ms": _percentile(round_trips, 0.99) * 1000,
                "ping_max_ms": max(round_trips, default=math.nan) * 1000,
            }
            print(json.dumps({"probe": figures}), flush=True)

    async with (
        connect(CID, "probe-pub", port=port) as pub,
        connect(CID, "probe-sub", port=port) as sub_client,
        sub_client.subscribe("soak.probe") as sub,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(ping)
        nursery.start_soon(publish, pub)
        nursery.start_soon(receive, sub)
        nursery.start_soon(report)
        await trio.sleep(minutes * 60 + 5)
        nursery.cancel_scope.cancel()


# -- the driver -----------------------------------------------------------------------------------


def _metric_sum(text: str, name: str, exclude: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and (not exclude or exclude not in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--plot", help="write RSS and p99 latency over time to this PNG")
    parser.add_argument("--server_args", default="", help="more server flags, e.g. '--file_sync=false'")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--role", choices=["load", "probe"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import trio

    if args.role == "load":
        trio.run(_load, args.port, args.clients, args.minutes, Path(args.out))
        return
    if args.role == "probe":
        trio.run(_probe, args.port, args.minutes)
        return
    _drive(args)


def _drive(args: argparse.Namespace) -> None:
    import tempfile

    import psutil
    from rich.console import Console

    from bench import peers
    from bench.report import machine, print_report

    console = Console(stderr=True)
    http_port = peers.free_port()
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    rows: list[dict[str, Any]] = []
    extra = shlex.split(args.server_args)
    with peers.ours("-m", str(http_port), "--max_channels", "0", "--max_subs", "0", *extra, data=work) as server:
        proc = psutil.Process(server.pid)
        out = work / "load.json"
        me = [sys.executable, __file__, "--port", str(server.port), "--minutes", str(args.minutes)]
        load = subprocess.Popen(
            [*me, "--role", "load", "--clients", str(args.clients), "--out", str(out)],
            stdout=subprocess.PIPE,
            text=True,
        )
        probe = subprocess.Popen([*me, "--role", "probe"], stdout=subprocess.PIPE, text=True)
        os.set_blocking(load.stdout.fileno(), False)  # type: ignore[union-attr]
        os.set_blocking(probe.stdout.fileno(), False)  # type: ignore[union-attr]
        started = time.monotonic()
        probe_window: list[dict[str, float]] = []
        load_last: dict[str, int] = {}
        redelivered_before = 0.0
        cpu_before = sum(proc.cpu_times()[:2])
        minute = 0
        while load.poll() is None:
            time.sleep(1)
            for stream in (probe.stdout, load.stdout):
                for line in stream.readlines() if stream else []:
                    item = json.loads(line)
                    if "probe" in item:
                        probe_window.append(item["probe"])
                    elif "load" in item:
                        load_last = item["load"]
                    else:
                        console.print(f"[red]{item}")
            if time.monotonic() - started < 60 * (minute + 1) or minute >= args.minutes:
                continue
            minute += 1
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
            redelivered = _metric_sum(metrics, "streaming_deliveries_total", 'reason="new"')
            connections = _metric_sum(metrics, "streaming_connections") or float(
                json.loads(urllib.request.urlopen(f"http://127.0.0.1:{http_port}/streaming/serverz").read()).get(
                    "clients", 0
                )
            )
            memory = proc.memory_info()
            row = {
                "minute": minute,
                "rss_mb": memory.rss / 2**20,
                # The message file's pages mapped into the process count in RSS and grow with the
                # data stored; the rest (the heap) is what must level off.
                "anon_mb": (memory.rss - memory.shared) / 2**20,
                "open_fds": proc.num_fds(),
                "connections": connections,
                "ping_p99_ms": max((w["ping_p99_ms"] for w in probe_window), default=math.nan),
                "ping_max_ms": max((w["ping_max_ms"] for w in probe_window), default=math.nan),
                "latency_p99_ms": max((w["latency_p99_ms"] for w in probe_window), default=math.nan),
                "latency_p50_ms": _percentile([w["latency_p50_ms"] for w in probe_window], 0.5),
                "redeliveries": redelivered - redelivered_before,
                "published": load_last.get("published", 0),
                "received": load_last.get("received", 0),
                "server_cpu_share": (sum(proc.cpu_times()[:2]) - cpu_before) / 60,
            }
            redelivered_before = redelivered
            cpu_before = sum(proc.cpu_times()[:2])
            probe_window = []
            rows.append(row)
            console.print(
                f"min {minute:>3}: RSS {row['rss_mb']:.0f} MB ({row['anon_mb']:.0f} MB heap), fds {row['open_fds']}, "
                f"connections {row['connections']:.0f}, PING p99 {row['ping_p99_ms']:.1f} ms "
                f"(max {row['ping_max_ms']:.0f}), publish->deliver p50 {row['latency_p50_ms']:.2f} / "
                f"p99 {row['latency_p99_ms']:.1f} ms, redeliveries {row['redeliveries']:.0f}, "
                f"published {row['published']}, received {row['received']}, "
                f"server CPU {row['server_cpu_share']:.0%} of a core"
            )
        probe.kill()
        final = json.loads(out.read_text())
    result = {"machine": machine(), "minutes": args.minutes, "clients": args.clients, "per_minute": rows, **final}
    if args.plot and rows:
        _plot(args.plot, rows)
    figures = [
        ("RSS, first / last minute (MB)", f"{rows[0]['rss_mb']:.0f} / {rows[-1]['rss_mb']:.0f}" if rows else "-", ""),
        ("of which heap (not file pages), first / last (MB)", _first_last(rows, "anon_mb"), ""),
        ("open fds, last minute", str(rows[-1]["open_fds"]) if rows else "-", ""),
        ("PING p99, worst minute (ms)", _worst(rows, "ping_p99_ms"), ""),
        (
            "publish->deliver p99, worst minute (ms)",
            f"{max(r['latency_p99_ms'] for r in rows):.1f}" if rows else "-",
            "",
        ),
        ("acknowledged messages lost", str(final["acked_lost"]), "0"),
        (
            "durables / groups / plain subscribers missing messages",
            f"{final['durables_incomplete']} / {final['groups_incomplete']} / {final['plain_incomplete']}",
            "0 / 0 / 0",
        ),
        ("messages stored", str(final["stored"]), ""),
    ]
    print_report(console, f"soak: {args.clients} clients, {args.minutes:g} minutes", figures, result, args.json)


def _first_last(rows: list[dict[str, Any]], key: str) -> str:
    return f"{rows[0][key]:.0f} / {rows[-1][key]:.0f}" if rows else "-"


def _worst(rows: list[dict[str, Any]], key: str) -> str:
    return f"{max(r[key] for r in rows):.1f}" if rows else "-"


def _plot(path: str, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["minute"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(minutes, [r["rss_mb"] for r in rows], marker="o", label="RSS")
    top.plot(minutes, [r.get("anon_mb", r["rss_mb"]) for r in rows], marker="o", label="of which heap")
    top.set_ylabel("server memory (MB)")
    top.legend()
    top.set_ylim(bottom=0)
    bottom.plot(minutes, [r["latency_p99_ms"] for r in rows], marker="o", label="publish -> deliver p99")
    bottom.plot(minutes, [r["ping_p99_ms"] for r in rows], marker="o", label="PING round trip p99 (loop stalls)")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("minute")
    bottom.set_ylim(bottom=0)
    bottom.legend()
    fig.suptitle("soak: server memory and tail latency over time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
