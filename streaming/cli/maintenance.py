"""`streaming-server check` and `streaming-server repair`: look over, or rebuild, a stopped server's data
directory (storage.repair)."""

from __future__ import annotations

import argparse
import shlex
import sys

from storage import StoreError
from streaming.config import ConfigError, load, merged


def way_forward(directory: str) -> str:
    where = shlex.quote(directory)
    return (
        f"`streaming-server check --dir {where}` lists every problem, `streaming-server repair --dir {where}` keeps "
        "everything intact and sets the damaged files aside (see docs/storage.md)"
    )


def _maintenance_parser(command: str) -> argparse.ArgumentParser:
    if command == "check":
        description = (
            "Look over a stopped server's data directory: every problem, each naming its file, and exactly "
            "which messages of which channels are damaged or missing. Writes nothing. Exit status 0: intact, "
            "1: damaged, 2: could not check."
        )
    else:
        description = (
            "Rebuild a stopped server's store from everything in it that is intact, move the old files to "
            "damaged-<time>/ in the data directory, and report exactly which messages of which channels are "
            "lost. An intact store is left as it is."
        )
    parser = argparse.ArgumentParser(prog=f"streaming-server {command}", description=description)
    parser.add_argument("-c", "--config", help="TOML configuration file (for its dir)")
    parser.add_argument("--dir", help="data directory (default: the config's, else ./streaming-data)")
    if command == "repair":
        parser.add_argument("-cid", "--cluster_id", help="only if the server record is lost: the cluster ID")
    return parser


def maintenance_main(command: str, argv: list[str]) -> int:
    from storage.repair import check, repair

    args = _maintenance_parser(command).parse_args(argv)
    try:
        config = load(args.config, {}) if args.config else merged({}, {})
    except ConfigError as exc:
        print(f"streaming-server {command}: configuration error: {exc}", file=sys.stderr)
        return 2
    directory = args.dir or config.dir
    try:
        report = check(directory) if command == "check" else repair(directory, getattr(args, "cluster_id", None))
    except (StoreError, OSError) as exc:
        print(f"streaming-server {command}: {exc}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    if command == "check":
        print(f"{directory}: {'intact' if report.clean else 'damaged'}")
        return 0 if report.clean else 1
    return 0
