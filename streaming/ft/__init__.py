"""Fault-tolerance groups: one active server and standbys per group, sharing one replicated log in
NATS JetStream (docs/high-availability.md)."""
