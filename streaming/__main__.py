"""`python -m streaming [flags]` runs the server, as `streaming-server` does."""

from streaming.cli import server_main

raise SystemExit(server_main())
