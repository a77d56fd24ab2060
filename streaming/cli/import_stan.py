"""`streaming-server import-stan`: bring a stopped nats-streaming-server's file store into a new data
directory of ours (streaming.stan_import), printing what it found, what it wrote and every problem."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from storage import StoreError
from streaming.config import ConfigError, load, merged
from streaming.stan_import.crypto import CIPHERS, DecryptionError
from streaming.stan_import.filestore import FileStoreReader
from streaming.stan_import.framing import StanFormatError, TornRecordError
from streaming.stan_import.importer import ImportOptions, Report, import_store
from streaming.stan_import.limits import StanConfigError, load_retention
from streaming.stan_import.model import Progress, ReadOptions, RefusedError, StanStore
from streaming.stan_import.sqlstore import SqlStoreReader

KEY_VARIABLE = "NATS_STREAMING_ENCRYPTION_KEY"  # as nats-streaming-server, it wins over the flag
PROGRESS_FROM = 100_000  # messages: smaller stores import faster than a bar would draw


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streaming-server import-stan",
        description="Import a stopped nats-streaming-server's store (the --dir of its file store, or its SQL "
        "database) into a new data directory: "
        "every channel with its messages at their sequences and timestamps, registered clients, and "
        "subscriptions (durables, queue groups, plain ones) with their positions and pending messages. "
        "Never writes to the source. Exit status 0: imported (or, with --dry_run, importable), 1: refused, "
        "2: bad arguments.",
    )
    parser.add_argument("source", metavar="STAN_DIR", nargs="?", help="the nats-streaming-server store directory")
    parser.add_argument(
        "--sql_driver", choices=["postgres", "mysql"], help="a SQL store's database (with --sql_source)"
    )
    parser.add_argument("--sql_source", metavar="DSN", help="its data source, as the server was given it")
    parser.add_argument("--dir", help="the new data directory (default: the config's, else ./streaming-data)")
    parser.add_argument("-c", "--config", help="this server's TOML config (its dir and limits)")
    parser.add_argument("--encryption_key", metavar="KEY", help=f"the store's encryption key ({KEY_VARIABLE} wins)")
    parser.add_argument(
        "--encryption_cipher",
        choices=sorted(CIPHERS),
        type=str.upper,
        help="accepted for the server's flag; each payload names its own cipher",
    )
    parser.add_argument("--crc_poly", type=_number, metavar="N", help="the store's --file_crc_poly (e.g. 0x82f63b78)")
    parser.add_argument("--no_crc", action="store_true", help="do not check record checksums (--file_crc=false)")
    parser.add_argument(
        "--drop_partial_tail",
        action="store_true",
        help="leave out a record cut short at the end of a file by a crash (default: refuse the store)",
    )
    parser.add_argument("--stan_config", metavar="FILE", help="the server's config file: apply its store limits")
    parser.add_argument(
        "--messages_only",
        action="store_true",
        help="for a clustered node's store: import its messages, without clients and subscriptions",
    )
    parser.add_argument("--dry_run", action="store_true", help="read everything and report; write nothing")
    return parser


def _number(text: str) -> int:
    return int(text, 0)


def import_stan_main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.source is None) == (args.sql_source is None) or bool(args.sql_source) != bool(args.sql_driver):
        parser.error("give STAN_DIR, or --sql_driver and --sql_source")
    try:
        config = load(args.config, {}) if args.config else merged({}, {})
        ours = config.store_limits()
        retention = load_retention(args.stan_config) if args.stan_config else None
    except (ConfigError, StanConfigError) as exc:
        print(f"streaming-server import-stan: {exc}", file=sys.stderr)
        return 2
    key = os.environ.get(KEY_VARIABLE) or args.encryption_key
    read = ReadOptions(
        crc_poly=args.crc_poly,
        verify_crc=not args.no_crc,
        drop_partial_tail=args.drop_partial_tail,
        encryption_key=key.encode() if key else None,
    )
    options = ImportOptions(
        dry_run=args.dry_run,
        messages_only=args.messages_only,
        retention=retention,
        ours=ours,
    )
    target = Path(args.dir or config.dir)
    reader: FileStoreReader | SqlStoreReader | None = None
    try:
        if args.source is not None:
            reader = FileStoreReader(args.source, read)
        else:
            reader = SqlStoreReader(args.sql_driver, args.sql_source, read)
        store = reader.read()
        _found(store)
        total = sum(c.msgs for c in store.channels)
        with _progress(total) as progress:
            report = import_store(store, target, options, progress)
    except (RefusedError, StanFormatError, DecryptionError, StoreError, OSError) as exc:
        print(f"streaming-server import-stan: {_why(exc, key is not None)}", file=sys.stderr)
        return 1
    finally:
        if isinstance(reader, SqlStoreReader):
            reader.close()
    _done(store, report, target, args.dry_run)
    if retention is not None:
        print("the STAN config's limits, to keep them applying here, in this server's config file (-c):")
        print(retention.as_toml(), end="")
    return 0


def _why(exc: Exception, keyed: bool) -> str:
    if isinstance(exc, DecryptionError):
        return f"{exc}: wrong --encryption_key" if keyed else str(exc)
    if isinstance(exc, TornRecordError):
        return f"refused: {exc} (or --drop_partial_tail to import all but it); nothing was imported"
    if isinstance(exc, StanFormatError):
        return f"refused: {exc}; nothing was imported"
    return str(exc)


def _found(store: StanStore) -> None:
    server = store.server
    print(
        f"found: cluster {server.ClusterID!r}{f', clustered node {server.NodeID!r}' if server.NodeID else ''}, "
        f"{len(store.channels)} channels, {sum(c.msgs for c in store.channels)} messages, "
        f"{sum(len(c.subscriptions) for c in store.channels)} subscriptions, {len(store.clients)} registered clients"
    )


def _done(store: StanStore, report: Report, target: Path, dry_run: bool) -> None:
    for line in store.notes + report.lines:
        print(line)
    done = "would write" if dry_run else "wrote"
    print(
        f"{done} {target}: {report.channels} channels, {report.messages} messages, {report.subscriptions} "
        f"subscriptions, {report.clients} clients in {report.seconds:.2f} s"
        + (
            ""
            if dry_run
            else f"; start it with `streaming-server --dir {target} --cluster_id {store.server.ClusterID}`"
        )
    )


@contextmanager
def _progress(total: int) -> Iterator[Progress | None]:
    if total < PROGRESS_FROM or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress as Bar

    with Bar(transient=True) as bar:
        task = bar.add_task("importing messages", total=total)
        yield lambda n: bar.advance(task, n)
