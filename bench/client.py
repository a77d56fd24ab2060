"""Our client under each AnyIO backend, against one server: pipelined publish, consume with an ack per
message, one publish at a time, and the client's own CPU per message.

    python bench/client.py [--quick] [--json] [--messages N] [--runs R] [--backends trio,asyncio]

Each run starts a fresh server (LMDB, every PubAck fsynced) and, in this process under the backend,
publishes N x 128 B pipelined (PubAck window), reads them back with a manual ack each (MaxInflight
1024), then publishes 2,000 one at a time. Figures are medians over the runs; client CPU is this
process's CPU time (it runs nothing but the client) per message.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import publish_pipelined  # noqa: E402
from bench.report import arguments, machine, print_report  # noqa: E402
from streaming.client import StartPosition, connect  # noqa: E402

PAYLOAD = b"x" * 128
SEQUENTIAL = 2_000


async def one_run(port: int, messages: int) -> dict[str, float]:
    async with connect("test-cluster", "bench-pub", port=port) as sc:
        wall, cpu = time.perf_counter(), time.process_time()
        await publish_pipelined(sc, "bench", messages, PAYLOAD)
        await sc.wait_pub_acks()
        publish = messages / (time.perf_counter() - wall)
        publish_cpu = (time.process_time() - cpu) / messages * 1e6
    async with connect("test-cluster", "bench-sub", port=port) as sc:
        wall, cpu = time.perf_counter(), time.process_time()
        async with sc.subscribe("bench", start_at=StartPosition.FIRST, max_inflight=1024, manual_ack=True) as sub:
            for _ in range(messages):
                msg = await sub.next_msg()
                msg.ack()
        consume = messages / (time.perf_counter() - wall)
        consume_cpu = (time.process_time() - cpu) / messages * 1e6
    async with connect("test-cluster", "bench-one", port=port) as sc:
        wall = time.perf_counter()
        for _ in range(SEQUENTIAL):
            await sc.publish("one", PAYLOAD)
        sequential = SEQUENTIAL / (time.perf_counter() - wall)
    return {
        "publish_msgs_per_s": publish,
        "consume_msgs_per_s": consume,
        "one_at_a_time_per_s": sequential,
        "publish_client_us_per_msg": publish_cpu,
        "consume_client_us_per_msg": consume_cpu,
    }


def main() -> None:
    parser = arguments(__doc__, "20,000 messages, 1 run per backend")
    parser.add_argument("--messages", type=int, help="messages per run (default 100,000; quick 20,000)")
    parser.add_argument("--runs", type=int, help="runs per backend (default 3; quick 1)")
    parser.add_argument("--backends", default="trio,asyncio", help="AnyIO backends to run (default trio,asyncio)")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    messages = args.messages or (20_000 if args.quick else 100_000)
    runs = args.runs or (1 if args.quick else 3)
    result: dict[str, Any] = {"machine": machine(), "messages": messages}
    rows: list[tuple[str, str, str]] = []
    for backend in args.backends.split(","):
        figures: list[dict[str, float]] = []
        for _ in range(runs):
            with peers.ours() as server:
                figures.append(anyio.run(one_run, server.port, messages, backend=backend))
        for key in figures[0]:
            value = statistics.median(f[key] for f in figures)
            result[f"{backend}_{key}"] = round(value, 2)
            rows.append((f"{backend} {key}", f"{value:,.2f}" if "us" in key else f"{value:,.0f}", ""))
    print_report(console, f"Our client, {messages:,} messages", rows, result, args.json)


if __name__ == "__main__":
    main()
