"""Console entry points: `streaming-server` (run the server; `check` and `repair` its data directory) and
`streaming` (publish and subscribe from a shell)."""

from streaming.cli.client import client_main
from streaming.cli.server import server_main

__all__ = ["client_main", "server_main"]
