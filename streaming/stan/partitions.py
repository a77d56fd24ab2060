"""Partitioning: which channels this server owns, and the check that no other server owns one too.

Several servers with one cluster ID share a NATS cluster, each owning the channels its `[channels]`
list names (wildcards allowed), as nats-streaming-server's partitioning does. Every server registers
every client; each subscribes only to its own channels' publish subjects and ignores subscription
requests for other channels.

Two servers owning one channel would each store half of its messages. Each server therefore sends
its claim (`Claim`: its channel patterns, when it started) on `_STAN.partitions.<cluster ID>` when it
starts and again whenever its NATS topology changes (a reconnect, a node joining), and every server
that hears a claim overlapping its own answers with its own. Of two overlapping servers the one that
started later (the newcomer) refuses to run, naming the channels; the other carries on.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence

import attrs
import trio

from streaming.stan.bus import Bus
from streaming.wire.subjects import valid_subject

log = logging.getLogger(__name__)
CLAIM_WAIT_S = 0.5  # how long a starting server listens for answers to its claim
# After a topology change the claim goes out at once and again after these pauses: a new route's
# interest may reach the other nodes after the INFO that announced it.
REANNOUNCE_AFTER_S = (0.5, 2.0)


class PartitionConflict(Exception):
    """Another server of the cluster ID owns some of this server's channels."""


def overlap(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether some channel matches both patterns (given as tokens)."""
    while a and b:
        x, y = a[0], b[0]
        if x == ">" or y == ">":
            return True
        if x != y and x != "*" and y != "*":
            return False
        a, b = a[1:], b[1:]
    return not a and not b


class Partition:
    """The channels one server owns: subject patterns such as `orders`, `orders.*`, `orders.>`."""

    def __init__(self, patterns: Sequence[str]) -> None:
        if not patterns:
            raise ValueError("partitioning needs the channels this server owns ([channels] in the config)")
        for pattern in patterns:
            if not valid_subject(pattern):
                raise ValueError(f"{pattern!r} is not a channel name or pattern")
        self.patterns = tuple(patterns)
        self._tokens = [pattern.split(".") for pattern in patterns]

    def owns(self, channel: str) -> bool:
        tokens = channel.split(".")
        return any(overlap(pattern, tokens) for pattern in self._tokens)

    def overlapping(self, patterns: Sequence[str]) -> list[str]:
        """This server's patterns that some of `patterns` overlap."""
        theirs = [p.split(".") for p in patterns if isinstance(p, str)]
        return [
            mine
            for mine, tokens in zip(self.patterns, self._tokens, strict=True)
            if any(overlap(tokens, t) for t in theirs)
        ]


@attrs.frozen
class Claim:
    server: str  # the server's name, for the message that names the conflict
    token: str  # unique per process: its own claims are not a conflict
    started: float  # wall-clock time: the later of two overlapping servers gives way
    channels: tuple[str, ...]

    def encode(self) -> bytes:
        return json.dumps(attrs.asdict(self)).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Claim | None:
        try:
            data = json.loads(payload)
            return cls(str(data["server"]), str(data["token"]), float(data["started"]), tuple(data["channels"]))
        except (ValueError, KeyError, TypeError):
            return None

    def newer_than(self, other: Claim) -> bool:
        return (self.started, self.token) > (other.started, other.token)


class Claims:
    """Announces this server's partition and watches for overlapping ones (see the module docstring)."""

    def __init__(self, bus: Bus, cluster_id: str, server_name: str, partition: Partition) -> None:
        self._bus = bus
        self.partition = partition
        self.subject = f"_STAN.partitions.{cluster_id}"
        self.mine = Claim(server_name, secrets.token_hex(8), time.time(), partition.patterns)
        self._inbox = f"{self.subject}.answers.{self.mine.token}"
        self.conflict: PartitionConflict | None = None
        self._found = trio.Event()
        self._changed = trio.Event()

    def start(self) -> None:
        """Listen for other servers' claims and for answers to this one's."""
        self._bus.subscribe(self.subject, self._on_claim)
        self._bus.subscribe(self._inbox, self._on_claim)

    def announce(self) -> None:
        self._bus.publish(self.subject, self.mine.encode(), self._inbox)

    def topology_changed(self) -> None:
        """The NATS side changed (a reconnect, a node joined): claim again, now and a little later."""
        self.announce()
        self._changed.set()

    async def check(self, wait: float = CLAIM_WAIT_S) -> None:
        """Announce and listen for `wait` s; PartitionConflict if this server is the newcomer."""
        self.announce()
        with trio.move_on_after(wait):
            await self._found.wait()
        if self.conflict is not None:
            raise self.conflict

    async def watch(self) -> None:
        """Claim again after topology changes, until a conflict makes this server the newcomer; then
        raise it (the server stops)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reannounce)
            await self._found.wait()
            nursery.cancel_scope.cancel()
        assert self.conflict is not None
        raise self.conflict

    async def _reannounce(self) -> None:
        while True:
            await self._changed.wait()
            self._changed = trio.Event()
            for pause in REANNOUNCE_AFTER_S:
                await trio.sleep(pause)
                self.announce()

    def _on_claim(self, subject: str, reply: str, payload: bytes) -> None:
        other = Claim.decode(payload)
        if other is None or other.token == self.mine.token:
            return
        shared = self.partition.overlapping(other.channels)
        if not shared:
            return
        if reply:  # it is announcing: it learns of this server from the answer
            self._bus.publish(reply, self.mine.encode())
        if self.mine.newer_than(other) and self.conflict is None:
            self.conflict = PartitionConflict(
                f"channels {', '.join(shared)} are owned by server {other.server!r} of this cluster ID already "
                f"(its channels: {', '.join(other.channels)}); a channel must have one owner"
            )
            log.error("partitioning: %s", self.conflict)
            self._found.set()
        elif not self.mine.newer_than(other):
            log.warning(
                "partitioning: server %r claims channels %s of this server; it started later and must give way",
                other.server,
                ", ".join(shared),
            )
