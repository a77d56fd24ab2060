"""Console entry points: `streaming-server` (run the server; `check` and `repair` its data directory) and
`streaming` (publish and subscribe from a shell). Each loads only its own command's modules when it
runs, so `streaming pub` does not import the server."""

from __future__ import annotations


def client_main(argv: list[str] | None = None) -> int:
    from streaming.cli.client import client_main as main

    return main(argv)


def server_main(argv: list[str] | None = None) -> int:
    from streaming.cli.server import server_main as main

    return main(argv)


__all__ = ["client_main", "server_main"]
