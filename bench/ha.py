"""High availability: an FT group with its log replicated three times, against a JetStream stream with
three replicas on the same three nats-server nodes, with the same client language (Node) on both.

    python bench/ha.py [--quick] [--json] [--kills N]

Needs nats-server (the dev extra), `npm ci --prefix bench/node` (node-nats-streaming and nats.js) and
`npm ci --prefix tests/node` (the load of the takeover part, tests/node/ft_load.js).

Throughput (each round a fresh three-node cluster per system, rounds alternated; medians reported):
- `jetstream_r3_*`: nats.js 2.x, a file stream with num_replicas 3;
- `ours_ft_*`: node-nats-streaming through an FT group of two members, `--ft_replicas 3`;
- `ours_single_*`: node-nats-streaming through one server attached to the same cluster, no group
  (what replication costs);
- `*_publish`: pipelined publishes, every PubAck awaited; `*_consume`: push delivery of what was
  published, an ack per message, MaxInflight / max_ack_pending 1024;
- `*_cpu_us`: CPU of every server process (the members and the three nats-server nodes) per message
  over the publish part.

`--sync-always`: the nodes fsync every JetStream write (`sync_interval: always`) instead of every two
minutes, for both systems: what that durability costs.

Takeover (`--kills`, default 10; quick 3): the group under node-nats-streaming load (200 msg/s, a
durable, a queue group of two and a plain subscriber); the active is killed with SIGKILL, and the
figure is the time from the kill to the first PubAck after it; the killed member then comes back as
a standby and catches up before the next kill. `redeliveries` counts deliveries, during that takeover,
of messages a subscriber had acknowledged (the acks the dead active had not written to the log yet).

Rebuild: a group of one gets the messages published and consumed (acked), then a second member
starts with an empty data directory; `rebuild_*` is how soon its store holds the whole log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.node_clients import NODE_DIR, ServerCpu, drive  # noqa: E402
from bench.peers import NatsNode, nats_cluster  # noqa: E402
from bench.report import arguments, machine, print_report  # noqa: E402
from tests.support.ft import Load, Member, caught_up, first_ack_after, member, the_active  # noqa: E402
from tests.support.servers import ATTACHED, ServerProcess  # noqa: E402


def _node_pids(nodes: list[NatsNode]) -> list[int]:
    return [n.proc.pid for n in nodes if n.proc is not None]


@contextlib.contextmanager
def _system(name: str, root: Path, sync_always: bool) -> Iterator[tuple[NatsNode, list[int]]]:
    """A fresh three-node cluster, and for ours a group (or one server) on it: where clients connect,
    and every server process."""
    with nats_cluster(3, jetstream=True, sync_always=sync_always) as nodes:
        if name == "jetstream_r3":
            yield nodes[0], _node_pids(nodes)
            return
        if name == "ours_ft":
            members = [member(f"m{i}", nodes, root / name, replicas=3) for i in range(2)]
            try:
                for m in members:
                    m.start()
                the_active(members)
                pids = [m.process.proc.pid for m in members if m.process.proc is not None]
                yield nodes[0], pids + _node_pids(nodes)
            finally:
                for m in members:
                    m.process.stop()
            return
        single = ServerProcess(["--nats_server", nodes[0].url, "--dir", str(root / name)], ready=ATTACHED)
        single.start()
        try:
            assert single.proc is not None
            yield nodes[0], [single.proc.pid, *_node_pids(nodes)]
        finally:
            single.stop()


def _run(name: str, workload: str, messages: int, root: Path, sync_always: bool) -> tuple[float, float]:
    """msgs/s of the timed part, and the servers' CPU µs per message over it."""
    with _system(name, root, sync_always) as (node, pids):
        cpu = ServerCpu(*pids)
        client = "jetstream" if name == "jetstream_r3" else "ours"
        argv = ["node", str(NODE_DIR / "clients.js"), client, workload, str(node.port), str(messages), "1", ""]
        result = drive(argv, cpu, "start")
    if not result.get("ok"):
        raise RuntimeError(f"{name} {workload}: {result.get('error')}")
    return float(result["msgs_per_s"]), cpu.seconds / messages * 1e6


def throughput(messages: int, rounds: int, root: Path, console: Console, sync_always: bool) -> dict[str, float]:
    samples: dict[str, list[float]] = {}
    systems = ("jetstream_r3", "ours_ft", "ours_single")
    for r in range(rounds):
        for workload in ("publish", "consume"):
            for name in systems if r % 2 == 0 else tuple(reversed(systems)):
                rate, cpu = _run(name, workload, messages, root / f"{r}-{workload}-{name}", sync_always)
                console.log(f"round {r + 1}: {name} {workload}: {rate:,.0f} msg/s, {cpu:.0f} µs CPU/msg")
                samples.setdefault(f"{name}_{workload}", []).append(rate)
                samples.setdefault(f"{name}_{workload}_cpu_us", []).append(cpu)
    return {k: statistics.median(v) for k, v in samples.items()}


def takeovers(kills: int, root: Path, console: Console) -> dict[str, Any]:
    times: list[float] = []
    redeliveries: list[int] = []
    with nats_cluster(3, jetstream=True) as nodes:
        members: list[Member] = [member(f"m{i}", nodes, root / "takeover", replicas=3) for i in range(2)]
        try:
            for m in members:
                m.start()
            active = the_active(members)
            load = Load(nodes, "ha")
            load.wait_acked(300)
            for k in range(kills):
                before = len(load.events)
                killed_at = time.time() * 1000
                active.process.kill()
                new = the_active([m for m in members if m is not active], within=30)
                load.wait_acked(load.acked() + 200)
                events = list(load.events)
                took = first_ack_after(events, killed_at)
                acked_by: dict[tuple[str, str], int] = {}
                for e in events[:before]:
                    if "s" in e:
                        acked_by[(e["s"], e["d"])] = 1
                again = sum(1 for e in events[before:] if "s" in e and (e["s"], e["d"]) in acked_by)
                times.append(took)
                redeliveries.append(again)
                console.log(f"kill {k + 1}: first PubAck after {took:.2f}s, {again} redeliveries of acked messages")
                active.start()  # back as a standby
                caught_up(active, new)
                active = new
            load.stop()
        finally:
            for m in members:
                if m.alive():
                    m.signal(signal.SIGCONT)
                m.process.stop()
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "takeover_p50_s": statistics.median(times),
        "takeover_p99_s": p99,
        "takeover_max_s": max(times),
        "takeover_redeliveries": redeliveries,
        "takeovers_s": times,
    }


def rebuild(messages: int, root: Path, console: Console) -> dict[str, float]:
    """A member started with an empty data directory on a group whose log holds `messages` published
    messages (and their subscription state): how long until its store holds the whole log."""
    with nats_cluster(3, jetstream=True) as nodes:
        first = member("m0", nodes, root / "rebuild", replicas=3).start()
        try:
            the_active([first])
            argv = ["node", str(NODE_DIR / "clients.js"), "ours", "consume", str(nodes[0].port), str(messages), "1", ""]
            result = drive(argv, ServerCpu(first.process.proc.pid if first.process.proc else 0), "start")
            if not result.get("ok"):
                raise RuntimeError(f"filling the log: {result.get('error')}")
            page = first.serverz()
            assert page is not None
            records = int(page["ft_applied"])
            second = member("m1", nodes, root / "rebuild", replicas=3)
            started = time.monotonic()
            second.start()
            while True:
                page = second.serverz()
                if page is not None and int(page["ft_applied"]) >= records:
                    break
                time.sleep(0.05)
            seconds = time.monotonic() - started
            second.process.stop()
        finally:
            first.process.stop()
    console.log(f"rebuild: {records:,} log records ({messages:,} messages) in {seconds:.2f}s")
    return {
        "rebuild_s": seconds,
        "rebuild_records": records,
        "rebuild_msgs_per_s": messages / seconds,
        "rebuild_records_per_s": records / seconds,
    }


def main() -> None:
    parser = arguments(__doc__, "20,000 messages, one round, 3 kills (default: 50,000, three rounds, 10 kills)")
    parser.add_argument("--kills", type=int, help="active members killed in the takeover part")
    parser.add_argument(
        "--sync-always",
        action="store_true",
        help="the nats-server nodes fsync every JetStream write (sync_interval: always), for both systems",
    )
    args = parser.parse_args()
    console = Console(stderr=args.json)
    messages, rounds, kills = (20_000, 1, 3) if args.quick else (50_000, 3, 10)
    kills = args.kills if args.kills is not None else kills
    if not (NODE_DIR / "node_modules").exists():
        raise SystemExit("the Node clients are not installed: npm ci --prefix bench/node")
    os.environ["JS_REPLICAS"] = "3"  # clients.js makes its JetStream stream with three replicas
    with tempfile.TemporaryDirectory(prefix="bench-ha-") as tmp:
        root = Path(tmp)
        result: dict[str, Any] = {
            "machine": machine(),
            "messages": messages,
            "rounds": rounds,
            "sync_always": args.sync_always,
        }
        result.update(throughput(messages, rounds, root, console, args.sync_always))
        if kills:
            result.update(takeovers(kills, root, console))
            result.update(rebuild(4 * messages, root, console))
    rows = []
    for workload in ("publish", "consume"):
        js, ft, single = (result[f"{s}_{workload}"] for s in ("jetstream_r3", "ours_ft", "ours_single"))
        target = "≥ 1.0x" if workload == "publish" else "≥ 1.5x"
        rows.append((f"{workload}: JetStream R3 msg/s", f"{js:,.0f}", ""))
        rows.append((f"{workload}: ours, FT group R3 msg/s", f"{ft:,.0f} ({ft / js:.2f}x)", target))
        rows.append((f"{workload}: ours, single server msg/s", f"{single:,.0f}", ""))
        for s in ("jetstream_r3", "ours_ft", "ours_single"):
            rows.append((f"{workload}: {s} server CPU µs/msg", f"{result[f'{s}_{workload}_cpu_us']:.0f}", ""))
    if kills:
        p50, p99 = result["takeover_p50_s"], result["takeover_p99_s"]
        rows.append(("takeover p50 / p99 s", f"{p50:.2f} / {p99:.2f}", "p99 ≤ 5"))
        rows.append(("redeliveries per takeover", str(result["takeover_redeliveries"]), "few"))
        rows.append(("rebuild from the log, msgs/s", f"{result['rebuild_msgs_per_s']:,.0f}", ""))
    print_report(console, "FT group (R3) vs JetStream R3", rows, result, args.json)


if __name__ == "__main__":
    main()
