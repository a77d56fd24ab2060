"""Console entry points `streaming-server` and `streaming`.

Until the network front end lands (issue 4), `streaming-server` opens (or creates) the store in its
data directory, reports what it recovered, and exits; that already checks the lock, the cluster ID
and the schema version of an existing directory.
"""

from __future__ import annotations

import argparse
import sys

from storage import StoreError, open_store

DEFAULT_DATA_DIR = "streaming-data"


def server_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streaming-server", description=__doc__)
    parser.add_argument("--cluster_id", default="test-cluster", help="cluster ID (default %(default)s)")
    parser.add_argument("--store", choices=["lmdb", "memory"], default="lmdb", help="store type (default %(default)s)")
    parser.add_argument("--dir", default=DEFAULT_DATA_DIR, help="data directory (default ./%(default)s)")
    args = parser.parse_args(argv)
    try:
        store = open_store(args.store, args.dir, args.cluster_id)
    except StoreError as exc:
        print(f"streaming-server: {exc}", file=sys.stderr)
        return 1
    with store:
        state = store.recover()
        pending = sum(len(s.pending) for s in state.subscriptions)
        where = f"in {args.dir}" if args.store == "lmdb" else "in memory"
        print(
            f"store ready {where} (cluster {state.server.cluster_id!r}): {len(state.channels)} channels, "
            f"{sum(c.msgs for c in state.channels)} messages, {len(state.subscriptions)} subscriptions, "
            f"{pending} pending, {len(state.clients)} clients"
        )
    print("the network front end (NATS/STAN on port 4222) is not implemented yet (issue 4); exiting")
    return 0


def client_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streaming", description="publish and subscribe from the shell")
    parser.parse_args(argv)
    print("streaming: the pub and sub commands arrive with the network front end (issue 4)", file=sys.stderr)
    return 2
