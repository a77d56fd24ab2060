"""Scale-out: publish and consume throughput over many channels, with 1, 2, 3 partitioned servers
behind a 3-node nats-server cluster, against one server on its embedded broker (and, with
`--workers N`, `streaming-server --workers N`; with `--jetstream`, JetStream on one nats-server;
with `--stan N`, N nats-streaming-server processes, the server ours replaces, which runs a channel in
one process only, so N processes are how it spreads over cores).

    python bench/scale.py [--quick] [--json] [--channels C] [--messages M] [--servers 1,2,3]
                          [--workers N] [--jetstream] [--stan N]

Workload: C channels, one publisher process and one subscriber process per channel (Python
clients), M messages of 128 B per channel. Publish: every publisher starts at the same instant and
publishes pipelined (PubAck window), timed until the last PubAck. Consume: then every subscriber
reads its channel from the start with a manual ack per message (MaxInflight 1024), timed until the
last ack. Figures are messages per second over all channels (total / the span from the earliest
start to the latest end).

Partitioned servers own channel i when i % servers is their index (`[channels]` lists them), and
are attached to node index % 3; the clients of channel i use node i % 3. Reported: the scaling
factor of each added server (against 1 partitioned server) and the cost of the NATS hop (1
partitioned server against the embedded broker). On a 2-core machine the factors are bounded by
the cores; the script runs unchanged on a bigger one (`--channels 12 --messages 40000 --workers 12
--jetstream --stan 12` is the 16-core comparison docs/scale-out.md quotes). nats-streaming-server
(`STAN_SERVER`, else ../shared/peers) runs its FILE store at its defaults; channel i is on process
i % N, and the same Python clients drive it (they speak STAN).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import peers  # noqa: E402
from bench.load import jetstream_publish, publish_pipelined  # noqa: E402
from bench.report import arguments, machine, print_report  # noqa: E402
from streaming.client import StartPosition, connect  # noqa: E402

PAYLOAD = b"x" * 128
CID = "test-cluster"
START_DELAY_S = 3.0  # client processes start, connect, then all begin at one instant this far ahead


# -- one client process --------------------------------------------------------------------------


async def _ours_client(
    role: str, port: int, channel: str, messages: int, start_at: float, window: int
) -> tuple[float, float]:
    name = f"{role}-{channel}-{os.getpid()}"
    async with connect(CID, name, port=port, request_timeout_s=30, max_pub_acks_inflight=window) as sc:
        await trio.sleep(max(0.0, start_at - time.time()))
        started = time.time()
        if role == "publish":
            futures = await publish_pipelined(sc, channel, messages, PAYLOAD)
            await sc.wait_pub_acks()
            failed = [f.error for f in futures if f.error]
            if failed:  # a publish refused, or its PubAck lost: not a figure
                raise SystemExit(f"{channel}: {len(failed)} of {messages} publishes failed: {failed[0]}")
        else:
            async with sc.subscribe(channel, start_at=StartPosition.FIRST, max_inflight=1024, manual_ack=True) as sub:
                for _ in range(messages):
                    msg = await sub.next_msg()
                    msg.ack()
        return started, time.time()


async def _jetstream_client(role: str, port: int, channel: str, messages: int, start_at: float) -> tuple[float, float]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    try:
        if role == "publish":
            await js.add_stream(name=f"S_{channel}", subjects=[channel], storage=StorageType.FILE)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        started = time.time()
        if role == "publish":
            await jetstream_publish(js, channel, messages, PAYLOAD)
        else:
            config = ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1024, deliver_policy=DeliverPolicy.ALL
            )
            sub = await js.subscribe(channel, durable=f"d_{channel}", config=config, manual_ack=True)
            for _ in range(messages):
                msg = await sub.next_msg(timeout=120)
                await msg.ack()
        return started, time.time()
    finally:
        await nc.close()


def client_main(argv: list[str]) -> None:
    """`scale.py --client SYSTEM ROLE PORT CHANNEL MESSAGES START_AT WINDOW`: prints {"start", "end"}."""
    system, role, port, channel, messages, start_at, window = argv
    if system == "jetstream":
        started, ended = asyncio.run(_jetstream_client(role, int(port), channel, int(messages), float(start_at)))
    else:
        args = (role, int(port), channel, int(messages), float(start_at), int(window))
        started, ended = trio.run(_ours_client, *args)
    print(json.dumps({"start": started, "end": ended}))


# -- the setups ----------------------------------------------------------------------------------


@contextmanager
def _process(command: list[str], port: int, ready: str = "", log: Path | None = None) -> Iterator[None]:
    """A server process: ready once `port` listens (and, with `ready`, once its log has that line)."""
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=out)
    try:
        peers.wait_port(port, proc)
        deadline = time.monotonic() + 60
        while ready and log is not None and ready not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        yield
    finally:
        peers.stop(proc)


@contextmanager
def partitioned(servers: int, channels: list[str]) -> Iterator[list[int]]:
    """A 3-node cluster and `servers` partitioned servers; yields each channel's client port."""
    data = Path(tempfile.mkdtemp(prefix="bench-partitioned-"))
    with peers.nats_cluster(3) as nodes, ExitStack() as stack:
        ports = [node.port for node in nodes]
        for s in range(servers):
            owned = [c for i, c in enumerate(channels) if i % servers == s]
            conf = data / f"s{s}.toml"
            tables = "".join(f'[channels."{c}"]\n' for c in owned)
            conf.write_text(
                f'nats_server = "nats://127.0.0.1:{ports[s % 3]}"\npartitioning = true\n'
                f'server_name = "s{s}"\ndir = "{data / f"s{s}"}"\nmax_channels = 0\n{tables}'
            )
            command = [sys.executable, "-m", "streaming", "-c", str(conf)]
            log = data / f"s{s}.log"
            stack.enter_context(_process(command, ports[s % 3], "Serving STAN clients", log))
        yield [ports[i % 3] for i in range(len(channels))]


@contextmanager
def workers(count: int, channels: list[str]) -> Iterator[list[int]]:
    data = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    port = peers.free_port()
    command = [sys.executable, "-m", "streaming", "--workers", str(count), "-a", "127.0.0.1", "-p", str(port)]
    command += ["--dir", str(data / "store"), "-mc", "0"]
    with _process(command, port, "streaming: Listening for client connections", data / "supervisor.log"):
        yield [port] * len(channels)


@contextmanager
def embedded(channels: list[str]) -> Iterator[list[int]]:
    with peers.ours("-mc", "0") as server:
        yield [server.port] * len(channels)


@contextmanager
def jetstream(channels: list[str]) -> Iterator[list[int]]:
    with peers.jetstream() as server:
        yield [server.port] * len(channels)


@contextmanager
def stan(count: int, channels: list[str]) -> Iterator[list[int]]:
    """`count` nats-streaming-server processes, each with its own store; channel i on process i % count."""
    with ExitStack() as stack:
        servers = [stack.enter_context(peers.stan()) for _ in range(count)]
        yield [servers[i % count].port for i in range(len(channels))]


def run_phase(system: str, role: str, ports: list[int], channels: list[str], messages: int, window: int) -> float:
    """Every channel's client at once; messages per second over all channels."""
    start_at = time.time() + START_DELAY_S + len(channels) * 0.1
    client = [sys.executable, __file__, "--client", system, role]
    procs = [
        subprocess.Popen(
            [*client, str(port), channel, str(messages), str(start_at), str(window)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for port, channel in zip(ports, channels, strict=True)
    ]
    spans = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            for other in procs:
                other.kill()
            raise RuntimeError(f"a {role} client of {system} failed (status {proc.returncode})")
        spans.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    return float(len(channels) * messages / elapsed)


def measure(
    name: str, setup: Any, channels: list[str], messages: int, console: Console, window: int
) -> dict[str, float]:
    system = "jetstream" if name == "jetstream" else "ours"
    with setup(channels) as ports:
        published = run_phase(system, "publish", ports, channels, messages, window)
        consumed = run_phase(system, "consume", ports, channels, messages, window)
    console.print(f"{name}: publish {published:,.0f}/s, consume {consumed:,.0f}/s")
    return {"publish": published, "consume": consumed}


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        client_main(sys.argv[2:])
        return
    parser = arguments(__doc__, "3 channels x 5,000 messages, 1 and 2 partitioned servers")
    parser.add_argument("--channels", type=int, help="channels (default 6; quick 3)")
    parser.add_argument("--messages", type=int, help="messages per channel (default 20,000; quick 5,000)")
    parser.add_argument("--servers", help='partitioned server counts to run (default 1,2,3; quick 1,2; "" for none)')
    parser.add_argument("--workers", type=int, default=0, help="also run `streaming-server --workers N`")
    parser.add_argument("--jetstream", action="store_true", help="also run JetStream (one nats-server, file)")
    parser.add_argument("--stan", type=int, default=0, help="also run N nats-streaming-server processes")
    parser.add_argument(
        "--window", type=int, default=16_384, help="each publisher's PubAck window (default 16,384, the client's)"
    )
    args = parser.parse_args()
    console = Console(stderr=args.json)
    count = args.channels or (3 if args.quick else 6)
    messages = args.messages or (5_000 if args.quick else 20_000)
    spec = args.servers if args.servers is not None else ("1,2" if args.quick else "1,2,3")
    servers = [int(s) for s in spec.split(",") if s]  # `--servers ""`: no partitioned servers
    channels = [f"scale{i}" for i in range(count)]
    if args.stan and peers.stan_binary() is None:
        raise SystemExit("--stan: nats-streaming-server not found (set STAN_SERVER)")

    setups: list[tuple[str, str, Any]] = [("embedded", "embedded", embedded)]
    setups += [(f"partitioned_{n}", f"{n} partitioned", lambda c, n=n: partitioned(n, c)) for n in servers]
    if args.workers:
        setups.append((f"workers_{args.workers}", f"--workers {args.workers}", lambda c: workers(args.workers, c)))
    if args.jetstream:
        setups.append(("jetstream", "jetstream", jetstream))
    if args.stan:
        setups.append((f"stan_{args.stan}", f"{args.stan} nats-streaming-server", lambda c: stan(args.stan, c)))
    result: dict[str, Any] = {"machine": machine(), "channels": count, "messages_per_channel": messages}
    result["window"] = args.window
    results: dict[str, dict[str, float]] = {}
    for key, name, setup in setups:
        try:
            results[key] = measure(name, setup, channels, messages, console, args.window)
        except RuntimeError as exc:  # one setup failing is reported, and the others still run
            result[f"{key}_error"] = str(exc)
            console.print(f"{name}: failed: {exc}")

    rows: list[tuple[str, str, str]] = []
    for key in (k for k, _, _ in setups if k not in results):
        rows.append((f"{key}", f"failed: {result[f'{key}_error']}", ""))
    for name, figures in results.items():
        for phase, value in figures.items():
            result[f"{name}_{phase}_msgs_per_s"] = round(value)
            rows.append((f"{name} {phase} msgs/s", f"{value:,.0f}", ""))
    one = results.get(f"partitioned_{servers[0]}") if servers else None
    if one is not None and servers[0] == 1 and "embedded" in results:
        for phase in ("publish", "consume"):
            hop = one[phase] / results["embedded"][phase]
            result[f"nats_hop_{phase}_ratio"] = round(hop, 3)
            rows.append((f"1 partitioned / embedded, {phase}", f"{hop:.2f}", "the hop's cost"))
            for n in (n for n in servers[1:] if f"partitioned_{n}" in results):
                factor = results[f"partitioned_{n}"][phase] / one[phase]
                result[f"scaling_{n}_{phase}"] = round(factor, 3)
                rows.append((f"{n} servers / 1, {phase}", f"{factor:.2f}", f"<= {n} (cores: {os.cpu_count()})"))
    if f"workers_{args.workers}" in results and "jetstream" in results:
        for phase, target in (("publish", 2.0), ("consume", 1.2)):
            ratio = results[f"workers_{args.workers}"][phase] / results["jetstream"][phase]
            result[f"workers_{phase}_vs_jetstream"] = round(ratio, 3)
            rows.append((f"--workers {args.workers} / JetStream, {phase}", f"{ratio:.2f}", f">= {target} (16 cores)"))
    if f"workers_{args.workers}" in results and f"stan_{args.stan}" in results:
        for phase in ("publish", "consume"):
            ratio = results[f"workers_{args.workers}"][phase] / results[f"stan_{args.stan}"][phase]
            result[f"workers_{phase}_vs_stan"] = round(ratio, 3)
            rows.append((f"--workers {args.workers} / {args.stan} nats-streaming-server, {phase}", f"{ratio:.2f}", ""))
    print_report(console, f"Scale-out, {count} channels x {messages:,} messages", rows, result, args.json)


if __name__ == "__main__":
    main()
