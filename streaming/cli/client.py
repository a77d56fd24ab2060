"""`streaming`: publish and subscribe from a shell, with the client library (streaming.client)."""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import time
from typing import Any

import trio

from streaming.cli.flags import flag
from streaming.units import parse_duration
from streaming.wire.subjects import has_wildcard

log = logging.getLogger("streaming")


def _connection_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The connection options; accepted before the subcommand and after it (`streaming pub -s ...`).
    Only the main parser has defaults, so a subcommand's parser never overwrites what came before."""

    def default(value: str) -> str:
        return value if defaults else argparse.SUPPRESS

    add = parser.add_argument
    add("-s", "--server", default=default("127.0.0.1:4222"), help="host:port (default 127.0.0.1:4222)")
    add("-c", "--cluster_id", default=default("test-cluster"), help="cluster ID (default test-cluster)")
    add("-id", "--client_id", default=default(""), help="client ID (default: a random one)")
    add("--connect_timeout", type=flag(parse_duration), default=default("5s"), help="wait for the server (default 5s)")


def _client_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streaming",
        description="Publish to and subscribe on a STAN server.",
        epilog="Connection options go before or after the subcommand: `streaming pub -s host:4222 orders hello`.",
    )
    _connection_options(parser, defaults=True)
    commands = parser.add_subparsers(dest="command", required=True)
    pub = commands.add_parser(
        "pub",
        help="publish messages, each stored before the command ends",
        description="Publish messages (or each line of standard input) and wait until the server has stored "
        "every one; prints the count and the rate at the end.",
    )
    _connection_options(pub, defaults=False)
    pub.add_argument("channel")
    pub.add_argument("message", nargs="*", help="messages (default: one per line of standard input)")
    pub.add_argument("-q", "--quiet", action="store_true", help="print only the summary, not each message")
    sub = commands.add_parser(
        "sub",
        help="print messages as they arrive: seq, redelivered, attempt, data",
        description="Print messages as they arrive. Our extensions (ignored by other STAN servers): "
        "--max_deliver, --backoff, --max_inflight_redeliveries, in-progress acks (--ack_progress) and "
        "negative acks (--nak).",
    )
    _connection_options(sub, defaults=False)
    sub.add_argument("channel")
    sub.add_argument("--durable", default="", help="durable name")
    sub.add_argument("--queue", "--qgroup", dest="queue", default="", help="queue group")
    sub.add_argument("--ack_wait", type=flag(parse_duration), default=30.0, help="AckWait (default 30s)")
    sub.add_argument("--max_inflight", type=int, default=1024, help="MaxInflight (default 1024)")
    start = sub.add_mutually_exclusive_group()
    start.add_argument("--all", action="store_true", help="start with the first stored message")
    start.add_argument("--last", action="store_true", help="start with the last stored message")
    start.add_argument("--seq", type=int, help="start at this sequence")
    start.add_argument("--since", type=flag(parse_duration), help="start with messages from this long ago (e.g. 1m)")
    sub.add_argument("--manual_ack", action="store_true", help="ack explicitly (see --no_ack, --ack_delay)")
    sub.add_argument("--no_ack", action="store_true", help="with --manual_ack: never ack (watch redeliveries)")
    sub.add_argument(
        "--ack_delay",
        type=flag(parse_duration),
        default=0.0,
        help="with --manual_ack: work this long on each message before acking it (a slow handler)",
    )
    sub.add_argument(
        "--ack_progress",
        action="store_true",
        help="with --ack_delay: tell the server every half AckWait that the message is still being worked on, "
        "so it is not redelivered meanwhile",
    )
    sub.add_argument(
        "--nak",
        type=flag(parse_duration),
        default=None,
        metavar="DELAY",
        help="with --manual_ack: give each message back on its first attempt, to come again after DELAY (0s: at "
        "once), and ack it then (a handler whose dependency is down)",
    )
    sub.add_argument(
        "--max_deliver",
        type=int,
        default=0,
        help="deliver each message at most this often, then publish it to the dead-letter channel (default 0 = "
        "no limit)",
    )
    sub.add_argument(
        "--dead_letter",
        default="",
        metavar="CHANNEL",
        help="with --max_deliver: where messages go after their last attempt (default CHANNEL.dead)",
    )
    sub.add_argument(
        "--backoff",
        type=flag(_durations),
        default=(),
        metavar="DELAYS",
        help="wait these long before each redelivery in turn, then the last again (e.g. 1s,5s,30s; default: AckWait)",
    )
    sub.add_argument(
        "--max_inflight_redeliveries",
        action="store_true",
        help="count redeliveries against MaxInflight too (a slow consumer is not flooded after a restart)",
    )
    sub.add_argument(
        "--ordered",
        action="store_true",
        help="with --queue: the group keeps each channel's order (one message of a channel out at a time)",
    )
    sub.add_argument("--count", type=int, default=0, help="exit after this many messages (default: run forever)")
    sub.add_argument("--unsubscribe", action="store_true", help="unsubscribe on exit (default: close)")
    return parser


def _durations(text: str) -> tuple[float, ...]:
    delays = tuple(parse_duration(part.strip()) for part in text.split(",") if part.strip())
    if not delays or any(d <= 0 for d in delays):
        raise ValueError(f"expected positive durations separated by commas (1s,5s,30s), got {text!r}")
    return delays


def client_main(argv: list[str] | None = None) -> int:
    parser = _client_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    host, _, port = args.server.rpartition(":")
    if not host or not port.isdigit():
        print(f"streaming: --server must be host:port, got {args.server!r}", file=sys.stderr)
        return 2
    if args.command == "sub" and args.ack_progress and not (args.manual_ack and args.ack_delay > 0):
        parser.error("--ack_progress needs --manual_ack and an --ack_delay")
    if args.command == "sub" and args.nak is not None and not args.manual_ack:
        parser.error("--nak needs --manual_ack")
    if args.command == "sub" and args.ordered and not args.queue:
        parser.error("--ordered needs --queue")
    # Random, not time-based: two commands started together must not take each other's ID.
    args.client_id = args.client_id or f"streaming-cli-{secrets.token_hex(6)}"
    from streaming.client import ConnectionClosedError, StanError

    try:
        return trio.run(_pub if args.command == "pub" else _sub, args, host, int(port))
    except (StanError, ConnectionClosedError) as exc:
        print(f"streaming: {exc}", file=sys.stderr)
        return 1
    except trio.TooSlowError:
        print(
            f"streaming: no answer from a STAN server with cluster ID {args.cluster_id!r} at {args.server} "
            f"(is the cluster ID right?)",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"streaming: cannot connect to {args.server}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


async def _pub(args: argparse.Namespace, host: str, port: int) -> int:
    from streaming.client import connect

    messages = args.message or (line.rstrip("\n") for line in sys.stdin)
    async with _connect(args, host, port, connect) as sc:
        started = time.perf_counter()
        count = 0
        window = []
        for text in messages:
            window.append((text, await sc.publish_async(args.channel, text.encode())))
            if len(window) >= 1024:
                count += await _acked(window, args)
                window = []
        count += await _acked(window, args)
        elapsed = time.perf_counter() - started
    rate = f", {count / elapsed:,.0f} msgs/s" if elapsed > 0 and count > 1 else ""
    print(f"published {count} message{'s' if count != 1 else ''} to {args.channel!r} in {elapsed:.3f} s{rate}")
    return 0


async def _acked(window: list[tuple[str, Any]], args: argparse.Namespace) -> int:
    """Wait for each PubAck of the window, in order (an error raises StanError)."""
    for text, future in window:
        guid = await future.wait()
        if not args.quiet:
            print(f"published {text!r} to {args.channel!r} (guid {guid})")
    return len(window)


def _connect(args: argparse.Namespace, host: str, port: int, connect: Any) -> Any:
    return connect(
        args.cluster_id,
        args.client_id,
        host=host,
        port=port,
        request_timeout_s=args.connect_timeout,
        max_reconnect_attempts=3,
    )


async def _sub(args: argparse.Namespace, host: str, port: int) -> int:
    from streaming.client import StartPosition, connect

    start, seq, delta = StartPosition.NEW_ONLY, 0, 0.0
    if args.all:
        start = StartPosition.FIRST
    elif args.last:
        start = StartPosition.LAST_RECEIVED
    elif args.seq is not None:
        start, seq = StartPosition.SEQUENCE_START, args.seq
    elif args.since is not None:
        start, delta = StartPosition.TIME_DELTA_START, args.since
    async with (
        _connect(args, host, port, connect) as sc,
        sc.subscribe(
            args.channel,
            queue=args.queue,
            durable=args.durable,
            ack_wait=args.ack_wait,
            max_inflight=args.max_inflight,
            start_at=start,
            start_sequence=seq,
            start_time_delta_s=delta,
            manual_ack=args.manual_ack,
            max_deliver=args.max_deliver,
            dead_letter_channel=args.dead_letter,
            backoff_s=args.backoff,
            max_inflight_redeliveries=args.max_inflight_redeliveries,
            ordered=args.ordered,
            close_on_exit=not args.unsubscribe,
        ) as sub,
    ):
        print(f"listening on {args.channel!r} as {args.client_id!r}", file=sys.stderr, flush=True)
        received = 0
        # A wildcard subscription's messages come from several channels, each with its own sequences.
        named = has_wildcard(args.channel)
        async for msg in sub:
            where = f"{msg.subject} " if named else ""
            print(
                f"[{where}#{msg.seq}] redelivered={str(msg.redelivered).lower()} attempt={msg.attempt}: "
                f"{msg.data.decode(errors='replace')}",
                flush=True,
            )
            if args.nak is not None and msg.attempt == 1:
                msg.nak(args.nak)
            elif args.manual_ack and not args.no_ack:
                await _work(msg, args)
                msg.ack()
            received += 1
            if args.count and received >= args.count:
                break
    return 0


async def _work(msg: Any, args: argparse.Namespace) -> None:
    """The slow handler of --ack_delay; with --ack_progress it keeps the message from redelivery."""
    done = trio.current_time() + args.ack_delay
    while trio.current_time() < done:
        step = min(done - trio.current_time(), args.ack_wait / 2) if args.ack_progress else done - trio.current_time()
        await trio.sleep(step)
        if args.ack_progress and trio.current_time() < done:
            msg.in_progress()
