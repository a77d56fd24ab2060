"""Console entry points: `streaming-server` (run the server; `check` and `repair` its data directory) and
`streaming` (publish and subscribe from a shell). Each loads only its own command's modules when it
runs, so `streaming pub` does not import the server."""

from __future__ import annotations

import sys


def client_main(argv: list[str] | None = None) -> int:
    from streaming.cli.client import client_main as main

    return main(argv)


def server_main(argv: list[str] | None = None) -> int:
    from streaming.cli.early_walk import begin_state_walk

    argv = sys.argv[1:] if argv is None else argv
    # Before the server's modules load: the store's state file walk runs on another core meanwhile.
    state_walk = begin_state_walk(argv)
    from streaming.cli.server import server_main as main

    return main(argv, state_walk=state_walk)


__all__ = ["client_main", "server_main"]
