"""`streaming-server import-stan`: bring a nats-streaming-server store (files or SQL) into ours, offline."""
