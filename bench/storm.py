"""A redelivery storm, reproduced, and what each of our mitigations does to it.

    python bench/storm.py [--quick] [--json] [--seconds S] [--out DIR] [--plot FILE.png]

The scenario of the NATS Streaming docs ("Redelivery Of Acknowledged Messages": AckWait 5 s, MaxInflight
1024, a 4 s handler), scaled down: AckWait 1 s, MaxInflight 1024, a handler that takes 0.8 s per
message, 200 messages waiting in the channel, one subscriber handling one message at a time and acking
it when done. All 200 are sent at once; every one still waiting in the client after 1 s is sent again,
and again, and a client that hands every copy to the handler spends its time on copies.

Runs (each on a fresh server with its delivery event log on, for `spark/storms.py`):
- `stock`: stock STAN semantics: no server option, and a client that hands every delivery to the
  handler (`suppress_copies=False`, as the reference clients do);
- `suppress`: client-side suppression of copies of messages acked or still queued (our client's default);
- `ack_progress`: stock, plus the client asking for more time for every message it holds
  (`Subscription.progress_held()` every AckWait / 3);
- `max_inflight_redeliveries`: stock, plus MaxInflight applied to redeliveries;
- `backoff`: stock, plus AckWait backoff 1, 2, 4, 8, 16, 32 s by attempt.

Each run lasts `--seconds` (full 30 s, quick 6 s; a storm does not end by itself: at 0.8 s a message,
the 200 would take 160 s even without one). Amplification = deliveries / distinct messages delivered,
from the run's event log (what the Spark job computes); handler amplification = handler calls /
distinct messages handled. JSON keys: `amplification_<run>`, `handler_amplification_<run>`,
`handled_<run>`, `wall_s_<run>`, `amplification_stock`, `amplification_best_mitigation` and
`best_mitigation` (targets: stock clearly > 1, best <= 1.05). Event logs: `--out` (default
bench/out/storm), one directory per run.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.report import arguments, bar_plot, machine, print_report, progress  # noqa: E402
from streaming.client import StartPosition, SubscribeOptions, connect  # noqa: E402

ACK_WAIT = 1
MAX_INFLIGHT = 1024
HANDLER_S = 0.8
MESSAGES = 200

RUNS: dict[str, tuple[SubscribeOptions, bool]] = {  # subscription options, ack-progress
    "stock": ({"suppress_copies": False}, False),
    "suppress": ({"suppress_copies": True}, False),
    "ack_progress": ({"suppress_copies": False}, True),
    "max_inflight_redeliveries": ({"suppress_copies": False, "max_inflight_redeliveries": True}, False),
    "backoff": ({"suppress_copies": False, "backoff_s": (1, 2, 4, 8, 16, 32)}, False),
}


async def scenario(
    port: int,
    seconds: float,
    options: SubscribeOptions,
    ack_progress: bool,
    *,
    messages: int = MESSAGES,
    handler_s: float = HANDLER_S,
) -> tuple[int, int]:
    """Publish `messages`, then handle them one at a time for `seconds`; (handler calls, distinct)."""
    handled: Counter[int] = Counter()
    async with connect("test-cluster", "storm-publisher", port=port) as pub:
        for i in range(messages):
            await pub.publish_async("storm", b"job %d" % i)
        await pub.wait_pub_acks()
    async with connect("test-cluster", "storm-worker", port=port) as sc:
        everything: SubscribeOptions = {
            **options,
            "start_at": StartPosition.FIRST,
            "ack_wait": ACK_WAIT,
            "max_inflight": MAX_INFLIGHT,
            "manual_ack": True,
        }
        sub = await sc.open_subscription("storm", **everything)
        async with trio.open_nursery() as nursery:
            if ack_progress:

                async def keep_alive() -> None:
                    while True:
                        await trio.sleep(ACK_WAIT / 3)
                        sub.progress_held()

                nursery.start_soon(keep_alive)
            with trio.move_on_after(seconds):
                while True:
                    msg = await sub.next_msg()
                    await trio.sleep(handler_s)  # the work
                    handled[msg.seq] += 1
                    msg.ack()
            nursery.cancel_scope.cancel()
        await sub.close()
    return sum(handled.values()), len(handled)


def amplification(events: Path) -> tuple[float, int, int]:
    """(deliveries / distinct messages delivered, deliveries, distinct) from an event log directory."""
    deliveries = 0
    seqs: set[int] = set()
    for event in peers.read_events(events):
        if event["event"] == "deliver" and event["channel"] == "storm":
            deliveries += 1
            seqs.add(event["seq"])
    return (deliveries / len(seqs) if seqs else 0.0), deliveries, len(seqs)


def run(name: str, seconds: float, out: Path) -> dict[str, float]:
    options, ack_progress = RUNS[name]
    events = out / name
    shutil.rmtree(events, ignore_errors=True)
    started = time.perf_counter()
    with peers.ours("--event_log", str(events)) as server:
        calls, distinct = trio.run(scenario, server.port, seconds, options, ack_progress)
    wall = time.perf_counter() - started
    factor, deliveries, delivered = amplification(events)
    return {
        "amplification": round(factor, 3),
        "deliveries": deliveries,
        "delivered": delivered,
        "handler_amplification": round(calls / distinct, 3) if distinct else 0.0,
        "handled": distinct,
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = arguments(__doc__, quick="6 s per run (under a minute)")
    parser.add_argument("--seconds", type=float, help="how long each run handles messages")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "out" / "storm", help="event logs, one dir per run"
    )
    parser.add_argument("--plot", metavar="FILE.png", help="amplification per run")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    seconds = args.seconds or (6.0 if args.quick else 30.0)
    result: dict[str, Any] = {
        "scale": "quick" if args.quick else "full",
        "machine": machine(),
        "seconds_per_run": seconds,
        "event_logs": str(args.out),
    }
    with progress(console) as bar:
        task = bar.add_task("storm", total=len(RUNS))
        for name in RUNS:
            bar.update(task, description=f"{name} ({seconds:g} s)")
            for key, value in run(name, seconds, args.out).items():
                result[f"{key}_{name}"] = value
            bar.advance(task)
    mitigations = [name for name in RUNS if name != "stock"]
    best = min(mitigations, key=lambda name: result[f"amplification_{name}"])
    result["best_mitigation"] = best
    result["amplification_best_mitigation"] = result[f"amplification_{best}"]
    rows = []
    for name in RUNS:
        target = "> 1" if name == "stock" else ("<= 1.05" if name == best else "")
        r = {key.removesuffix(f"_{name}"): value for key, value in result.items() if key.endswith(f"_{name}")}
        rows.append(
            (f"{name}: amplification", f"{r['amplification']:.2f} ({r['deliveries']} / {r['delivered']})", target)
        )
        rows.append((f"{name}: handler calls per message", f"{r['handler_amplification']:.2f} ({r['handled']})", ""))
    print_report(console, f"redelivery storm, {seconds:g} s per run ({result['scale']})", rows, result, args.json)
    if args.plot:
        groups = {
            name: {
                "server deliveries": float(result[f"amplification_{name}"]),
                "handler calls": float(result[f"handler_amplification_{name}"]),
            }
            for name in RUNS
        }
        bar_plot(args.plot, "redelivery storm: amplification per run", "per distinct message", groups)


if __name__ == "__main__":
    main()
