"""Beginning the LMDB store's state file walk at the very start of `streaming-server`, from the data
directory its command line names, before the configuration's and the server's modules load.

The walk (`storage.walk_ahead`, a forked child) takes about as long as those imports: begun after
them, a restart with 100,000 pending messages waits for it. This reads only what says where the store
is (`--dir`, `--store`, `--ft_group`, `--workers`, and the same keys of the `-c` TOML file) with a
parser of its own that knows nothing else. A guess is all it is: the store uses the walk only if it
was of its own state file and that file has not changed since (`WalkAhead`), and the server stops a
walk it does not use (`stop_unused`), so a command line read differently here costs a wasted walk,
never a wrong answer.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.state_walk import WalkAhead

DEFAULT_DIR = "streaming-data"  # ServerConfig.dir's default (a test holds the two equal)


def begin_state_walk(argv: list[str]) -> WalkAhead | None:
    """The walk of the state file of the LMDB store these arguments run, begun; None when they run
    another store, several, a maintenance command, or cannot be read this simply."""
    if argv[:1] and not argv[0].startswith("-"):  # a maintenance command (`check`, `repair`, ...)
        return None
    where = _store_directory(argv)
    if where is None:
        return None
    from storage import walk_ahead

    return walk_ahead(where)


def stop_unused(walk: WalkAhead | None, used: WalkAhead | None) -> None:
    """Stop `walk` unless it is the one the store was given."""
    if walk is not None and walk is not used:
        walk.discard()


def _store_directory(argv: list[str]) -> str | None:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in (("-c", "--config"), ("-st", "--store"), ("--dir",), ("--ft_group",), ("--workers",)):
        parser.add_argument(*flag)
    try:
        args, _ = parser.parse_known_args(argv)
    except SystemExit:  # the real parser says what is wrong
        return None
    file: dict[str, Any] = {}
    if args.config:
        import tomllib  # here: loading it first would delay the walk of a start without a file

        try:
            with open(args.config, "rb") as f:
                file = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError):
            return None
    store = args.store or file.get("store", "lmdb")
    if store != "lmdb" or args.ft_group or file.get("ft_group") or args.workers:
        return None
    where = args.dir or file.get("dir", DEFAULT_DIR)
    return where if isinstance(where, str) else None
