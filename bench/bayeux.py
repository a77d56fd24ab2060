"""Bayeux (CometD) delivery: ours (ack extension on, durable log, fsync per commit) vs Faye, same run,
over long-polling and over WebSocket.

    python bench/bayeux.py [--quick] [--json] [--runs N] [--rate R] [--auto-batch]

Both servers are driven by the same real client, `cometd@9` + `cometd-nodejs-client@2` under Node
with AckExtension registered (`bench/node/bayeux_clients.mjs`): one subscriber, one publisher, on
loopback, both over long-polling, then both over WebSocket (the client checks it got the transport
asked for: no silent fallback).
- warm-up: before each timed run the publisher sends `warmup` messages that are not counted, and the
  timed run starts once the subscriber has them all (both sides' code paths warm);
- throughput: the publisher sends N messages (~130 bytes of JSON) in batches of 100 per request or
  frame (`cometd.batch`), each batch once the last is answered; msgs/s = N / (last delivery - start).
- latency: the publisher sends one message per request at a fixed rate (`--rate`, default 200/s),
  stamped with its send time; latency = arrival at the subscriber - send, same process clock.
  Over long-polling the CometD client keeps one connection for the held connect and sends every
  other request on the second, one at a time: a publish queued behind one in flight waits for its
  answer (ours: after the fsync). `--auto-batch` turns on the client's `autoBatch` (what queued
  up goes as one request) for every system; by default the client runs as it comes.
Ours: `streaming-server --http_api_port` (a publish is answered after its commit, every message in
the durable log, the subscriber acknowledging batches). Faye 1.4 (npm `faye`, `bench/node/faye_server.js`):
a Node Bayeux server that keeps nothing on disk and has no acks. Each server is fresh for each run.
Runs go in rounds: each round runs every system once per transport and mode, who goes first
alternating between rounds; each figure is the median over rounds, and the ratio of each round is
printed too (how steady the comparison is). Full: 50,000 messages and 4,000 at the rate, 5 rounds;
quick: 20,000 and 1,000, 3 rounds (three to six minutes on 2 cores).

The floor (`bench/bayeux_floor.py`, both transports): a Bayeux server on our HTTP stack (hypercorn's
Trio worker and Starlette) that does what Faye does and nothing more: in memory, no acks, no checks.
Its throughput and latency bound what any server on that stack reaches with this client. The durable
floor (`bayeux_floor.py --durable`) is the same with each request's publishes appended to a file and
`fdatasync`ed before they fan out and are answered, as ours commits them: what the disk adds, so
what bounds a server that delivers only what is on disk.

JSON keys: `<system>[_ws]_msgs_per_s`, `<system>[_ws]_cpu_us_per_msg` (the server process's CPU over
the throughput run, per message), `<system>[_ws]_p50_ms`, `<system>[_ws]_p99_ms` (ours and Faye),
`[ws_]throughput_ratio_vs_faye` (target >= 1.0), `[ws_]p99_ratio_vs_faye` (target <= 1.5), with
`..._rounds` lists of the per-round ratios, `[ws_]floor_ratio_vs_faye`, `[ws_]floor_p99_ratio_vs_faye`,
`[ws_]throughput_ratio_vs_floor`, `[ws_]durable_floor_ratio_vs_faye`, `[ws_]durable_floor_p99_ratio_vs_faye`,
`[ws_]p99_ratio_vs_durable_floor`; `<system>[_ws]_client_busy` (the share of one core the CometD client's
main thread used over the throughput run: near 1.0 the client is the limit, as it is with Faye) and
`[ws_]client_ceiling_vs_faye` (ours msgs/s over that share, against Faye's msgs/s: what a server that
never kept the client waiting would show with this client, so whether the target is within the
client's reach at all).
"""

from __future__ import annotations

import statistics
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.node_clients import NODE_DIR, ServerCpu, client_ceiling, drive  # noqa: E402
from bench.report import arguments, machine, print_report, progress  # noqa: E402

BATCH = 100
TRANSPORTS = ("long-polling", "websocket")
# The floors' latency too: what the stack costs before any work of ours, and what the disk adds to it.
SYSTEMS = ("ours", "faye", "floor", "durable_floor")
FLOOR = [sys.executable, str(ROOT / "bench" / "bayeux_floor.py"), "{port}"]
_SUFFIX = {"long-polling": "", "websocket": "_ws"}  # in figures' keys: ours_ws_msgs_per_s
_RATIO = {"long-polling": "", "websocket": "ws_"}  # in ratios' keys: ws_throughput_ratio_vs_faye


def server(system: str) -> AbstractContextManager[peers.Server]:
    """A fresh server: ours with its HTTP client port, Faye, or the floor of our HTTP stack (durable or not)."""
    if system == "ours":
        return peers.http_server("bayeux")
    if system == "floor":
        return peers.http_server("floor", FLOOR)
    if system == "durable_floor":
        return peers.http_server("durable_floor", [*FLOOR, "--durable", "{data}"])
    return peers.http_server("faye", ["node", str(NODE_DIR / "faye_server.js"), "{port}"])


def run_client(
    system: str, transport: str, mode: str, count: int, knob: int, warmup: int, *, auto_batch: bool = False
) -> dict[str, Any]:
    """One run of the CometD clients against a fresh `system`; `auto_batch`: both clients with CometD's
    `autoBatch` on."""
    with server(system) as srv:
        cpu = ServerCpu(srv.pid)
        url = f"http://127.0.0.1:{srv.port}/cometd"
        argv = ["node", str(NODE_DIR / "bayeux_clients.mjs"), url, mode, str(count), str(knob), transport, str(warmup)]
        if auto_batch:
            argv.append("autobatch")
        result = drive(argv, cpu, "ready")
        if not result.get("ok"):
            raise SystemExit(f"{system} {transport} {mode}: {result.get('error')}")
        result["cpu_us_per_msg"] = cpu.seconds / count * 1e6
        return result


def plan(runs: int) -> list[tuple[str, str, str]]:
    """(transport, mode, system) in the order they run: every round runs each once, and the systems
    alternate inside it, so a slow spell of the machine falls on all of them."""
    order: list[tuple[str, str, str]] = []
    for round_ in range(runs):
        for transport in TRANSPORTS:
            for mode in ("throughput", "latency"):
                # Who goes first alternates between rounds.
                systems = SYSTEMS if round_ % 2 == 0 else tuple(reversed(SYSTEMS))
                order += [(transport, mode, system) for system in systems]
    return order


def main() -> None:
    parser = arguments(
        __doc__, quick="20,000 messages and 1,000 at the rate after a warm-up, 3 alternating rounds (3-6 minutes)"
    )
    parser.add_argument("--runs", type=int, help="rounds (default 5, quick 3)")
    parser.add_argument("--rate", type=int, default=200, help="messages/s in the latency run (default 200)")
    parser.add_argument(
        "--auto-batch", action="store_true", help="the CometD clients with autoBatch on (default off, as CometD ships)"
    )
    args = parser.parse_args()
    if not (NODE_DIR / "node_modules" / "faye").exists():
        raise SystemExit("the Node clients are not installed: npm ci --prefix bench/node")
    console = Console(stderr=args.json)
    count, timed, warmup = (20_000, 1_000, 2_000) if args.quick else (50_000, 4_000, 5_000)
    runs = args.runs or (3 if args.quick else 5)
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "runs": runs}
    result.update({"messages": count, "latency_messages": timed, "rate": args.rate, "batch": BATCH, "warmup": warmup})
    result["auto_batch"] = args.auto_batch
    samples: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    order = plan(runs)
    with progress(console) as bar:
        task = bar.add_task("runs", total=len(order))
        for transport, mode, system in order:
            bar.update(task, description=f"{system} {transport}: {mode}")
            size, knob = (count, BATCH) if mode == "throughput" else (timed, args.rate)
            samples.setdefault((transport, mode, system), []).append(
                run_client(system, transport, mode, size, knob, warmup, auto_batch=args.auto_batch)
            )
            bar.advance(task)
    rows: list[tuple[str, str, str]] = []
    for transport in TRANSPORTS:
        x = _SUFFIX[transport]
        for system in SYSTEMS:
            through = samples.get((transport, "throughput", system), [])
            if not through:
                continue
            result[f"{system}{x}_msgs_per_s"] = round(statistics.median(r["msgs_per_s"] for r in through))
            result[f"{system}{x}_cpu_us_per_msg"] = round(statistics.median(r["cpu_us_per_msg"] for r in through), 2)
            result[f"{system}{x}_client_busy"] = round(statistics.median(r["client_busy"] for r in through), 3)
            latency = samples.get((transport, "latency", system), [])
            if latency:
                result[f"{system}{x}_p50_ms"] = round(statistics.median(r["p50_ms"] for r in latency), 2)
                result[f"{system}{x}_p99_ms"] = round(statistics.median(r["p99_ms"] for r in latency), 2)
        # Steadiness: the ratio in each round (ours against Faye of the same round), then its spread.
        ours, faye = samples[(transport, "throughput", "ours")], samples[(transport, "throughput", "faye")]
        ours_lat, faye_lat = samples[(transport, "latency", "ours")], samples[(transport, "latency", "faye")]
        ratio = _RATIO[transport]
        through = result[f"ours{x}_msgs_per_s"] / result[f"faye{x}_msgs_per_s"]
        result[f"{ratio}throughput_ratio_vs_faye"] = round(through, 3)
        result[f"{ratio}throughput_ratio_rounds"] = [
            round(o["msgs_per_s"] / f["msgs_per_s"], 3) for o, f in zip(ours, faye, strict=True)
        ]
        result[f"{ratio}p99_ratio_vs_faye"] = round(result[f"ours{x}_p99_ms"] / result[f"faye{x}_p99_ms"], 3)
        result[f"{ratio}p99_ratio_rounds"] = [
            round(o["p99_ms"] / f["p99_ms"], 3) for o, f in zip(ours_lat, faye_lat, strict=True)
        ]
        result[f"{ratio}floor_ratio_vs_faye"] = round(result[f"floor{x}_msgs_per_s"] / result[f"faye{x}_msgs_per_s"], 3)
        result[f"{ratio}floor_p99_ratio_vs_faye"] = round(result[f"floor{x}_p99_ms"] / result[f"faye{x}_p99_ms"], 3)
        result[f"{ratio}throughput_ratio_vs_floor"] = round(
            result[f"ours{x}_msgs_per_s"] / result[f"floor{x}_msgs_per_s"], 3
        )
        durable = result[f"durable_floor{x}_msgs_per_s"], result[f"durable_floor{x}_p99_ms"]
        result[f"{ratio}durable_floor_ratio_vs_faye"] = round(durable[0] / result[f"faye{x}_msgs_per_s"], 3)
        result[f"{ratio}durable_floor_p99_ratio_vs_faye"] = round(durable[1] / result[f"faye{x}_p99_ms"], 3)
        result[f"{ratio}durable_floor_p99_rounds"] = [
            round(d["p99_ms"] / f["p99_ms"], 3)
            for d, f in zip(samples[(transport, "latency", "durable_floor")], faye_lat, strict=True)
        ]
        result[f"{ratio}p99_ratio_vs_durable_floor"] = round(result[f"ours{x}_p99_ms"] / durable[1], 3)
        # The client's share of a core bounds what a faster server could show it: its rate if never idle.
        ceiling = statistics.median(client_ceiling(r["msgs_per_s"], r["client_busy"]) for r in ours)
        result[f"{ratio}client_ceiling_vs_faye"] = round(ceiling / result[f"faye{x}_msgs_per_s"], 3)
    for key, value in result.items():
        if key.startswith(SYSTEMS):
            rows.append((key, f"{value:,}" if isinstance(value, int) else f"{value}", ""))
    for prefix, name in (("", "long-polling"), ("ws_", "WebSocket")):
        rows.append((f"{prefix}throughput_ratio_vs_faye", f"{result[prefix + 'throughput_ratio_vs_faye']}", ">= 1.0"))
        rows.append((f"  per round ({name})", ", ".join(map(str, result[prefix + "throughput_ratio_rounds"])), ""))
        rows.append((f"{prefix}p99_ratio_vs_faye", f"{result[prefix + 'p99_ratio_vs_faye']}", "<= 1.5"))
        rows.append((f"  per round ({name})", ", ".join(map(str, result[prefix + "p99_ratio_rounds"])), ""))
        rows.append((f"{prefix}floor_ratio_vs_faye", f"{result[prefix + 'floor_ratio_vs_faye']}", ""))
        rows.append((f"{prefix}floor_p99_ratio_vs_faye", f"{result[prefix + 'floor_p99_ratio_vs_faye']}", ""))
        rows.append((f"{prefix}throughput_ratio_vs_floor", f"{result[prefix + 'throughput_ratio_vs_floor']}", ""))
        for key in ("durable_floor_ratio_vs_faye", "durable_floor_p99_ratio_vs_faye"):
            rows.append((f"{prefix}{key}", f"{result[prefix + key]}", ""))
        rows.append((f"  per round ({name})", ", ".join(map(str, result[prefix + "durable_floor_p99_rounds"])), ""))
        rows.append((f"{prefix}p99_ratio_vs_durable_floor", f"{result[prefix + 'p99_ratio_vs_durable_floor']}", ""))
        rows.append((f"{prefix}client_ceiling_vs_faye", f"{result[prefix + 'client_ceiling_vs_faye']}", ""))
    batching = ", autoBatch" if args.auto_batch else ""
    title = f"Bayeux with the CometD client{batching}: {count:,} messages, latency at {args.rate}/s ({result['scale']})"
    print_report(console, title, rows, result, args.json)


if __name__ == "__main__":
    main()
