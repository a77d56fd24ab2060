"""`streaming-server`: run the server (or, with `--workers N`, N of them behind a local nats-server).

Flags follow nats-streaming-server where users look for them (`-p`, `--cluster_id`, `--store`,
`--dir`, `--max_msgs`, `-m/--http_port`, `-c/--config`, `-D/-V`); flags override the TOML file.
`streaming-server check` and `streaming-server repair` are streaming.cli.maintenance's, and
`streaming-server import-stan` streaming.cli.import_stan's. What runs once the configuration is good
is streaming.cli.run's (a bad flag or file is answered before Trio and the server are loaded).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

from storage import VERIFY_MODES, state_directory, walk_ahead
from streaming.cli.early_walk import stop_unused
from streaming.cli.flags import flag
from streaming.cli.maintenance import maintenance_main
from streaming.config import ConfigError, load, merged
from streaming.security.tls import TlsError, server_context
from streaming.units import parse_bool, parse_duration, parse_size

if TYPE_CHECKING:
    from storage.state_walk import WalkAhead

log = logging.getLogger("streaming")


def _server_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streaming-server",
        description="A durable NATS Streaming (STAN) server on Trio and LMDB.",
        epilog="Durations take units (30s, 1m, 24h); sizes take 1MB, 1GiB. Flags override the config file. "
        "On a stopped server: `streaming-server check --dir DIR` lists what is damaged in a data directory, "
        "`streaming-server repair --dir DIR` keeps everything intact and sets the damaged files aside.",
    )
    parser.add_argument("-c", "--config", help="TOML configuration file")
    dur, size = flag(parse_duration), flag(parse_size)

    net = parser.add_argument_group("network").add_argument
    net("-a", "--addr", "--net", dest="host", help="interface to listen on (default 0.0.0.0)")
    net("-p", "--port", type=int, help="NATS client port (default 4222; 0 = any free port)")
    net("-cid", "--cluster_id", help="cluster ID (default test-cluster)")
    net("--max_payload", type=size, help="largest message accepted (default 1MB)")
    net("--max_pending", type=size, help="bytes queued for a client before it is cut off as slow (default 64MB)")
    net("--write_deadline", type=dur, help="a client must take a write within this (default 10s)")
    net("--connect_timeout", type=dur, help="a connection must send CONNECT within this (default 2s)")
    net("--server_name", help="this server's name in monitoring, metrics and logs (default streaming-server)")
    ext = parser.add_argument_group("external NATS cluster and partitioning (docs/scale-out.md)").add_argument
    ext(
        "-ns",
        "--nats_server",
        metavar="URLS",
        help="attach to this NATS server or cluster (nats://[user:pass@]host:port, comma-separated) "
        "instead of the embedded broker",
    )
    ext("--nats_user", help="user for the NATS cluster (with --nats_pass)")
    ext("--nats_pass", dest="nats_password", metavar="PASSWORD", help="its password")
    ext("--nats_token", metavar="TOKEN", help="token for the NATS cluster")
    ext("--nats_nkey_seed", metavar="FILE", help="file holding the nkey seed (SU...) to log in to the NATS cluster")
    ext("--nats_creds", metavar="FILE", help="credentials file (user JWT and seed) to log in to the NATS cluster")
    ext("--tls_client_cert", metavar="FILE", help="client certificate (PEM) for a NATS cluster that requires TLS")
    ext("--tls_client_key", metavar="FILE", help="its private key (PEM)")
    ext("--tls_client_cacert", metavar="FILE", help="CAs of the NATS cluster's certificates (default: the system's)")
    ext(
        "--partitioning",
        action="store_const",
        const=True,
        help="own only the channels of the config file's [channels] (wildcards allowed); other servers with "
        "this cluster ID on the same NATS cluster own the rest",
    )
    ext(
        "--ft_group",
        metavar="NAME",
        help="be a member of this fault-tolerance group (with --nats_server: one member serves, the others "
        "stand by, sharing a log replicated in JetStream; docs/high-availability.md)",
    )
    ext("--ft_replicas", type=int, metavar="N", help="copies JetStream keeps of the group's log (default 3)")
    ext("--ft_lease", type=dur, help="a standby takes over after the active went this long silent (default 2s)")
    ext("--hash_partition", metavar="I/N", help="own partition I of N of the channel-name hash (what --workers runs)")
    ext(
        "--workers",
        type=int,
        metavar="N",
        help="use N cores: start a local nats-server on -p and N partitioned servers behind it, each with its "
        "own data directory under --dir; channels go to workers by a hash of their name",
    )
    auth = parser.add_argument_group("authentication (as nats-server's)").add_argument
    auth("--auth", dest="auth_token", metavar="TOKEN", help="clients must give this token (CONNECT auth_token)")
    auth("--user", help="clients must give this user and --pass (more users: [[users]] in the config file)")
    auth("--pass", dest="password", metavar="PASSWORD", help="the password of --user, or its bcrypt hash")
    tls = parser.add_argument_group("TLS (as nats-server's)").add_argument
    tls("--tls", action="store_const", const=True, help="TLS on the NATS port and the HTTP listeners")
    tls("--tlscert", dest="tls_cert", metavar="FILE", help="the server's certificate chain (PEM)")
    tls("--tlskey", dest="tls_key", metavar="FILE", help="its private key (PEM)")
    tls("--tlscacert", dest="tls_ca_cert", metavar="FILE", help="CA certificates for client certificates")
    tls(
        "--tlsverify",
        dest="tls_verify",
        action="store_const",
        const=True,
        help="require client certificates (implies --tls)",
    )
    net("--ping_interval", type=dur, help="interval between NATS pings to clients (default 2m)")

    store = parser.add_argument_group("store").add_argument
    store("-st", "--store", choices=["lmdb", "memory"], help="store type (default lmdb)")
    store("--dir", help="data directory for the lmdb store (default ./streaming-data)")
    store(
        "--file_sync",
        type=flag(parse_bool),
        metavar="BOOL",
        help="fsync every commit (default true); false: flush every --sync_interval instead, so a machine "
        "crash loses up to that much and can damage the store (a crash of the server process loses nothing)",
    )
    store("--sync_interval", type=dur, help="with --file_sync=false: how often to flush (default 1s)")
    store(
        "--verify_on_start",
        choices=VERIFY_MODES,
        help="what the lmdb store checks: background (default: the files' headers before serving, then the "
        "message file's pages and every message's checksum while serving, stopping the server on damage; "
        "nothing past a damaged message is served), full (all of that before serving) or quick (damage "
        "elsewhere is found when a message is read, or by `streaming-server check`)",
    )
    store("--recovery_hold", type=dur, help="after a restart, wait this long for clients with pending messages (5s)")

    limits = parser.add_argument_group("limits (per channel unless said; the config file sets them per channel)")
    lim = limits.add_argument
    lim("-mc", "--max_channels", type=int, help="max number of channels (default 100, 0 = unlimited)")
    lim("-msu", "--max_subs", type=int, help="max subscriptions per channel (default 1000, 0 = unlimited)")
    lim("-mm", "--max_msgs", type=int, help="max messages per channel (default 1000000, 0 = unlimited)")
    lim("-mb", "--max_bytes", type=size, help="max bytes per channel (default 1024000000, 0 = unlimited)")
    lim("-ma", "--max_age", type=dur, help="max message age (default 0 = unlimited)")
    lim("--max_inactivity", type=dur, help="delete channels idle this long (default 0 = never)")

    lim(
        "--wildcard_subscriptions",
        type=flag(parse_bool),
        metavar="BOOL",
        help="take subscriptions to a pattern (orders.*, orders.>) over every matching channel, now and later "
        "(default true; false refuses them as nats-streaming-server does)",
    )

    hb = parser.add_argument_group("heartbeats").add_argument
    hb("-hbi", "--hb_interval", type=dur, help="interval between server heartbeats (default 30s)")
    hb("-hbt", "--hb_timeout", type=dur, help="wait for a heartbeat answer (default 10s)")
    hb("-hbf", "--hb_fail_count", type=int, help="failed heartbeats before a client is closed (default 10)")

    mon = parser.add_argument_group("monitoring").add_argument
    mon(
        "-m",
        "--http_port",
        type=int,
        help="HTTP monitoring port: /metrics and /streaming/*z (default 0 = off, -1 = any free port)",
    )
    mon("--http_host", help="interface for the monitoring port, e.g. 127.0.0.1 (default: the NATS port's)")
    mon("--event_log", help="write the delivery event log (JSON Lines) into this directory (default off)")
    mon("--event_log_rotate", type=size, help="start a new event log file past this size (default 64MB)")

    api = parser.add_argument_group("HTTP clients (Bayeux/CometD, pull consumers)").add_argument
    api("--http_api_port", type=int, help="port for HTTP clients: Bayeux and the pull API (default 0 = off, -1 = any)")
    api("--http_api_host", help="interface for HTTP clients (default: the same as -a/--addr)")
    api("--http_api_max_body", type=size, help="refuse larger HTTP request bodies with 413 (default 1MiB)")
    api(
        "--http_api_allow_origins",
        type=_origins,
        metavar="ORIGINS",
        help="comma-separated origins whose pages may call the HTTP API and open its WebSockets, "
        "e.g. https://app.example.com (default none; * = any page, without credentials)",
    )
    api(
        "--http_api_ws_compression",
        type=flag(parse_bool),
        metavar="BOOL",
        help="compress WebSocket frames when the client offers permessage-deflate (default false)",
    )
    api("--bayeux_path", help="URL path of the Bayeux endpoint (default /cometd)")
    api("--bayeux_timeout", type=dur, help="longest a /meta/connect is held with nothing to deliver (default 30s)")
    api("--bayeux_interval", type=dur, help="pause advised between a connect reply and the next (default 0)")
    api("--bayeux_max_interval", type=dur, help="a session that does not connect this long expires (default 10s)")
    api("--bayeux_max_unacked", type=int, help="per subscription: messages out and not acknowledged (default 1024)")
    api("--pull_max_wait", type=dur, help="the longest an HTTP pull blocks for a message (default 30s)")
    api("--pull_tombstone_ttl", type=dur, help="how long an expired or deleted pull consumer is remembered (1h)")
    api("--pull_ack_replay_window", type=dur, help="how long a repeated ack is answered as the first (10m)")
    api("--pull_ack_replay", choices=["204", "405"], help="answer a repeated ack 204 (default) or 405")
    api(
        "--pull_msg_headers",
        type=flag(parse_bool),
        metavar="BOOL",
        help="also give every link as an Artemis REST msg-* header (default false)",
    )

    logs = parser.add_argument_group("logging").add_argument
    logs("-D", "--debug", action="store_true", help="debug logging")
    logs("-V", "--trace", action="store_true", help="trace logging (as debug, plus protocol detail)")

    tests = parser.add_argument_group("tests").add_argument
    tests(
        "--allow_ms_ack_wait",
        action="store_true",
        default=None,
        help="TEST ONLY: read a negative AckWait from clients as milliseconds",
    )
    return parser


def _origins(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    skip = {"config", "debug", "trace"}
    return {k: v for k, v in vars(args).items() if k not in skip and v is not None}


def server_main(argv: list[str] | None = None, state_walk: WalkAhead | None = None) -> int:
    """`streaming-server`. `state_walk`: the store's state file walk, begun from these arguments before
    this module loaded (streaming.cli.early_walk); used if it is of the store they configure."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _server_main(argv, state_walk)
    except BaseException:
        stop_unused(state_walk, None)
        raise


def _server_main(argv: list[str], early: WalkAhead | None) -> int:
    if argv[:1] in (["check"], ["repair"]):
        return maintenance_main(argv[0], argv[1:])
    if argv[:1] == ["import-stan"]:
        from streaming.cli.import_stan import import_stan_main

        return import_stan_main(argv[1:])
    args = _server_parser().parse_args(argv)
    overrides = _overrides(args)
    workers = overrides.pop("workers", 0)
    try:
        config = load(args.config, overrides) if args.config else merged({}, overrides)
        config.store_limits()
        tls_files = config.tls_files()
        if tls_files is not None:
            server_context(tls_files)  # the files are read now, so that a bad one stops the start here
        if config.nats_server:
            from streaming.server import link_options

            link_options(config)  # likewise the nkey seed and the TLS client files
        if workers and (workers < 1 or config.nats_server or config.partitioning or config.http_api_port):
            raise ConfigError(
                "--workers N needs N >= 1, and starts its own nats-server and partitions "
                "(no nats_server, partitioning or http_api_port: the HTTP doors are not partitioned)"
            )
    except (ConfigError, TlsError) as exc:
        stop_unused(early, None)
        print(f"streaming-server: configuration error: {exc}", file=sys.stderr)
        return 2
    level = logging.DEBUG if args.debug or args.trace else getattr(logging, config.log_level.upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s [%(levelname)s] %(name)s: %(message)s", stream=sys.stderr)
    state_walk = None
    if config.store == "lmdb" and not config.ft_group and not workers:
        if early is not None and early.env_dir == state_directory(config.dir):
            state_walk = early
        else:
            # The state file's structure walk runs on another core while Trio and the server load.
            state_walk = walk_ahead(config.dir)
    stop_unused(early, state_walk)
    if workers:
        from streaming.cli.run import run_workers

        return run_workers(config, workers, argv)
    # Trio, the engine and the doors are loaded only now: a bad flag or file is answered at once.
    from streaming.cli.run import run_server

    return run_server(config, state_walk)
