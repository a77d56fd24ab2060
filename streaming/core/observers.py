"""What the group commit tells metrics and the event log, beside the delivery engine's own events
(`streaming.core.engine.Observer`): one interface and a fan-out, so the publish path makes one call when
one or two observers listen (and skips the bookkeeping when none does). (Counters the broker and the STAN layer keep
themselves, such as slow consumers and refused requests, are read at scrape time instead.)
"""

from __future__ import annotations

from typing import Protocol


class ServerObserver(Protocol):
    def on_published(self, channel: str, first_seq: int, count: int, nbytes: int) -> None:
        """`count` messages stored in `channel` with consecutive sequences from `first_seq`."""

    def on_commit(self, seconds: float, messages: int) -> None:
        """One group commit (store append, fsync included) took `seconds`."""


class Fanout:
    """Several server observers as one."""

    def __init__(self, server: list[ServerObserver]) -> None:
        self.server = server

    def on_published(self, channel: str, first_seq: int, count: int, nbytes: int) -> None:
        for o in self.server:
            o.on_published(channel, first_seq, count, nbytes)

    def on_commit(self, seconds: float, messages: int) -> None:
        for o in self.server:
            o.on_commit(seconds, messages)
