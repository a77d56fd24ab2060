"""AckWait redelivery timeliness against real peers: 10,000 unacked messages, AckWait 1 s.

    python bench/redelivery.py [--quick] [--json] [--plot FILE.png]

A subscriber receives every message without acking and notes when each arrived; the server must send
each one again one AckWait later. The subscriber acks each redelivered copy at once, so a message that
comes a third time is a duplicate. Lateness = arrival of the redelivery - (first arrival + 1 s),
measured in the subscriber's process (so it includes the trip to the client both times).
- ours: STAN subscription, AckWait 1 s, MaxInflight above the count (nothing waits for room);
- jetstream: push consumer, ack_wait 1 s, max_ack_pending above the count, nats-py;
- redis: XREADGROUP by one consumer, and a second one running an XAUTOCLAIM loop (min idle 1 s, every
  10 ms): Redis has no redelivery of its own, this is what its users write.
- stan: nats-streaming-server (FILE store, its defaults), the same STAN subscription by our client;
  skipped when its binary is absent (`STAN_SERVER`, else ../shared/peers);
- ours_logged: ours again with its event log on (`--event_log`, off by default), which costs three
  lines per redelivered message (ack_timeout, deliver, ack) and gives the lateness as the server saw
  it (`ours_logged_server_lateness_*`: second send - (first send + AckWait), without the trips to the
  client). The headline figures are the default server's, as the peers run at their defaults.
The run ends when every message came back once, plus 1.5 s to catch duplicates (or after 30 s).
Each server runs on the last CPU and the clients on the others (`peers.pin_apart`; `--no-pin` to
leave them where Linux puts them): unpinned, this figure swings by 3x between runs of any system.

JSON keys: `<system>_lateness_p50_ms/_p99_ms/_max_ms`, `<system>_redelivered_once_fraction`,
`<system>_duplicates`; ours also as `lateness_p99_ms` and `redelivered_once_fraction` (target:
fraction 1.0); `lateness_p99_ratio_vs_jetstream` and `lateness_p99_ratio_vs_stan` = ours / theirs
(target <= 1.0: an absolute figure does not hold steady on this machine, a ratio in the same run does),
null when either p99 is not above zero (the subscriber's lag, not the server's timing: see the code).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import jetstream_publish, publish_pipelined, redis_xadd  # noqa: E402
from bench.report import arguments, machine, print_report, progress, spread_ms  # noqa: E402
from streaming.client import StartPosition, connect  # noqa: E402

PAYLOAD = b"x" * 128
ACK_WAIT = 1.0
LINGER = 1.5  # after the last redelivery: long enough for a second round to show up
LIMIT = 30.0
SYSTEMS = ("ours", "ours_logged", "jetstream", "redis", *(("stan",) if peers.stan_binary() else ()))


class Tally:
    """First arrivals, redelivery lateness and duplicates, keyed by message id."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.first: dict[Any, float] = {}
        self.lateness: list[float] = []
        self.again: Counter[Any] = Counter()

    def arrived(self, key: Any, now: float) -> bool:
        """Note an arrival; True when it is a redelivery (to be acked)."""
        first = self.first.get(key)
        if first is None:
            self.first[key] = now
            return False
        self.again[key] += 1
        if self.again[key] == 1:
            self.lateness.append(now - (first + ACK_WAIT))
        return True

    @property
    def all_back(self) -> bool:
        return len(self.lateness) >= self.count

    def figures(self) -> dict[str, float]:
        return {
            **spread_ms("lateness", (x * 1000 for x in self.lateness)),
            "redelivered_once_fraction": round(sum(1 for n in self.again.values() if n == 1) / self.count, 4),
            "duplicates": sum(n - 1 for n in self.again.values()),
        }


async def _ours(port: int, count: int) -> dict[str, float]:
    tally = Tally(count)
    async with connect("test-cluster", "bench-redelivery", port=port) as sc:
        await publish_pipelined(sc, "redeliver", count, PAYLOAD)
        await sc.wait_pub_acks()
        async with sc.subscribe(
            "redeliver", start_at=StartPosition.FIRST, ack_wait=ACK_WAIT, max_inflight=count + 1, manual_ack=True
        ) as sub:
            with trio.move_on_after(LIMIT):
                while not tally.all_back:
                    msg = await sub.next_msg()
                    if tally.arrived(msg.seq, time.perf_counter()):
                        msg.ack()
            with trio.move_on_after(LINGER):
                while True:
                    msg = await sub.next_msg()
                    tally.arrived(msg.seq, time.perf_counter())
                    msg.ack()
    return tally.figures()


async def _jetstream(port: int, count: int) -> dict[str, float]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    tally = Tally(count)
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="REDELIVER", subjects=["redeliver"], storage=StorageType.FILE)
    await jetstream_publish(js, "redeliver", count, PAYLOAD)
    back = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        if tally.arrived(msg.metadata.sequence.stream, time.perf_counter()):
            await msg.ack()
        if tally.all_back:
            back.set()

    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT, max_ack_pending=count + 1, deliver_policy=DeliverPolicy.ALL
    )
    sub = await js.subscribe("redeliver", durable="r", config=config, cb=on_msg, manual_ack=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(back.wait(), LIMIT)
    await asyncio.sleep(LINGER)
    await sub.unsubscribe()
    await nc.close()
    return tally.figures()


async def _redis(port: int, count: int) -> dict[str, float]:
    import redis.asyncio as aioredis

    tally = Tally(count)
    r = aioredis.Redis(port=port)
    await redis_xadd(r, "redeliver", count, PAYLOAD)
    await r.xgroup_create("redeliver", "g", id="0")
    read = 0
    while read < count:
        reply = await r.xreadgroup("g", "reader", {"redeliver": ">"}, count=1000)
        now = time.perf_counter()
        entries = cast(list[tuple[bytes, Any]], reply[0][1])  # type: ignore[index]
        for entry_id, _ in entries:
            tally.arrived(entry_id, now)
            read += 1
    deadline = time.perf_counter() + LIMIT
    linger_until = float("inf")
    while time.perf_counter() < min(deadline, linger_until):
        start = "0-0"
        while True:  # one sweep over everything idle for 1 s
            reply = await r.xautoclaim("redeliver", "g", "claimer", int(ACK_WAIT * 1000), start, count=1000)
            start, claimed = cast(str, reply[0]), cast(list[tuple[bytes, Any]], reply[1])
            now = time.perf_counter()
            if claimed:
                pipe = r.pipeline(transaction=False)
                for entry_id, _ in claimed:
                    tally.arrived(entry_id, now)
                    pipe.xack("redeliver", "g", entry_id)
                await pipe.execute()
            if start in (b"0-0", "0-0"):
                break
        if tally.all_back and linger_until == float("inf"):
            linger_until = time.perf_counter() + LINGER
        await asyncio.sleep(0.01)
    await r.aclose()
    return tally.figures()


def server_lateness(events: Path) -> dict[str, float]:
    """Ours, as the server saw it (its event log): second send - (first send + AckWait)."""
    first: dict[int, int] = {}
    late: list[float] = []
    for e in peers.read_events(events):
        if e["event"] != "deliver":
            continue
        if e["attempt"] == 1:
            first[e["seq"]] = e["ts"]
        elif e["attempt"] == 2 and e["seq"] in first:
            late.append((e["ts"] - first[e["seq"]]) / 1000 - ACK_WAIT * 1000)
    return spread_ms("server_lateness", late) if late else {}


def run(system: str, count: int, pin: bool = True) -> dict[str, float]:
    if system == "ours":
        with peers.ours() as server:
            if pin:
                peers.pin_apart(server)
            return trio.run(_ours, server.port, count)
    if system == "ours_logged":
        data = Path(tempfile.mkdtemp(prefix="bench-redelivery-"))
        try:
            with peers.ours("--event_log", str(data / "events")) as server:
                if pin:
                    peers.pin_apart(server)
                figures = trio.run(_ours, server.port, count)
            return {**figures, **server_lateness(data / "events")}
        finally:
            shutil.rmtree(data, ignore_errors=True)
    with peers.start(system) as server:
        if pin:
            peers.pin_apart(server)
        if system == "stan":
            return trio.run(_ours, server.port, count)
        if system == "redis":
            return asyncio.run(_redis(server.port, count))
        return asyncio.run(_jetstream(server.port, count))


def main() -> None:
    parser = arguments(
        __doc__, quick="the same run (it takes under a minute anyway)", plot="lateness p50/p99/max per system"
    )
    parser.add_argument("--no-pin", action="store_true", help="leave the server and the clients where Linux puts them")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    count = 10_000
    result: dict[str, Any] = {
        "scale": "quick" if args.quick else "full",
        "machine": machine(),
        "messages": count,
        "pinned": not args.no_pin,
    }
    with progress(console) as bar:
        task = bar.add_task("redelivery", total=len(SYSTEMS))
        for system in SYSTEMS:
            bar.update(task, description=system)
            for key, value in run(system, count, pin=not args.no_pin).items():
                result[f"{system}_{key}"] = value
            bar.advance(task)
    result["lateness_p99_ms"] = result["ours_lateness_p99_ms"]
    result["redelivered_once_fraction"] = result["ours_redelivered_once_fraction"]
    peers_run = [peer for peer in ("jetstream", "stan") if peer in SYSTEMS]
    ours = result["ours_lateness_p99_ms"]
    for peer in peers_run:
        theirs = result[f"{peer}_lateness_p99_ms"]
        # Measured in the subscriber, a p99 below zero is the subscriber's own lag: it took the burst of
        # first deliveries in more slowly than their redeliveries. A ratio then says nothing of the
        # servers, so there is none (the server's own figure is `ours_logged_server_lateness_*`).
        result[f"lateness_p99_ratio_vs_{peer}"] = round(ours / theirs, 3) if ours > 0 and theirs > 0 else None
    rows = []
    for system in SYSTEMS:
        for key, target in [
            ("lateness_p50_ms", ""),
            ("lateness_p99_ms", ""),
            ("lateness_max_ms", ""),
            ("redelivered_once_fraction", "1.0" if system.startswith("ours") else ""),
            *(
                [("server_lateness_p50_ms", ""), ("server_lateness_p99_ms", ""), ("server_lateness_max_ms", "")]
                if system == "ours_logged"
                else []
            ),
            ("duplicates", "0" if system.startswith("ours") else ""),
        ]:
            rows.append((f"{system}: {key}", f"{result[f'{system}_{key}']}", target))
    rows += [(key, f"{result[key]}", "<= 1") for key in (f"lateness_p99_ratio_vs_{peer}" for peer in peers_run)]
    print_report(console, f"redelivery of {count:,} unacked messages, AckWait 1 s", rows, result, args.json)
    if args.plot:
        from bench.report import bar_plot

        groups = {q: {s: float(result[f"{s}_lateness_{q}_ms"]) for s in SYSTEMS} for q in ("p50", "p99", "max")}
        bar_plot(args.plot, "redelivery lateness vs deadline", "ms", groups)


if __name__ == "__main__":
    main()
