"""Partitioning: which channels this server owns, and the check that no other server owns one too.

Several servers with one cluster ID share a NATS cluster, each owning the channels its `[channels]`
list names (wildcards allowed), as nats-streaming-server's partitioning does. Every server registers
every client; each subscribes only to its own channels' publish subjects and ignores subscription
requests for other channels.

`--workers N` (streaming.workers) partitions by a hash of the channel name instead (`HashPartition`):
the local nats-server's subject mappings send each channel's publishes to one worker, with the
mapping function nats-server calls `partition` (FNV-1a over the channel's tokens), and each worker
computes the same hash to know which subscription requests are its own.

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

from streaming.core.outbound import ClientRecord
from streaming.nats.bus import Bus, Origin
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

    hashed = False

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
        """This server's patterns that some of `patterns` overlap (a hash partition overlaps all)."""
        if any(isinstance(p, str) and p.startswith(_HASHED) for p in patterns):
            return list(self.patterns)
        theirs = [p.split(".") for p in patterns if isinstance(p, str)]
        return [
            mine
            for mine, tokens in zip(self.patterns, self._tokens, strict=True)
            if any(overlap(tokens, t) for t in theirs)
        ]

    def publish_subjects(self, cluster_id: str) -> list[str]:
        """What to subscribe to for the publishes of these channels."""
        return [f"_STAN.pub.{cluster_id}.{pattern}" for pattern in self.patterns]


_HASHED = "#"  # a hash partition's claim: "#3/12", partition 3 of 12
HASHED_TOKENS = 8  # a channel's partition is the hash of its first tokens, up to this many


def fnv1a_32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def channel_partition(channel: str, count: int) -> int:
    """The partition nats-server's `{{partition(count, ...)}}` mapping gives `channel`: FNV-1a of its
    tokens (up to HASHED_TOKENS of them) joined with nothing between."""
    return fnv1a_32("".join(channel.split(".")[:HASHED_TOKENS]).encode()) % count


def worker_mappings(cluster_id: str, count: int) -> str:
    """nats-server `mappings` that send each channel's publishes to the subject of its partition
    (`_STAN.wpub.<cluster ID>.<partition>`, then any tokens past HASHED_TOKENS)."""
    lines = []
    for n in range(1, HASHED_TOKENS + 2):
        tokens = min(n, HASHED_TOKENS)
        source = ".".join(["*"] * tokens) + (".>" if n > HASHED_TOKENS else "")
        hashed = ",".join(str(i) for i in range(1, tokens + 1))
        dest = f"_STAN.wpub.{cluster_id}.{{{{partition({count},{hashed})}}}}" + (".>" if n > HASHED_TOKENS else "")
        lines.append(f'  "_STAN.pub.{cluster_id}.{source}": "{dest}"')
    return "mappings = {\n" + "\n".join(lines) + "\n}\n"


class HashPartition(Partition):
    """Partition `index` of `count`: the channels `channel_partition` gives that number."""

    hashed = True

    def __init__(self, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(f"partition {index} of {count}: expected 0 <= index < count")
        self.index, self.count = index, count
        self.patterns = (f"{_HASHED}{index}/{count}",)

    def owns(self, channel: str) -> bool:
        return channel_partition(channel, self.count) == self.index

    def overlapping(self, patterns: Sequence[str]) -> list[str]:
        """The same partition, another count (two layouts on one cluster ID) or channel patterns."""
        theirs = [p for p in patterns if isinstance(p, str)]
        if not theirs:
            return []
        same_layout = all(p.startswith(_HASHED) and p.endswith(f"/{self.count}") for p in theirs)
        return [] if same_layout and self.patterns[0] not in theirs else list(self.patterns)

    def publish_subjects(self, cluster_id: str) -> list[str]:
        base = f"_STAN.wpub.{cluster_id}.{self.index}"
        return [base, f"{base}.>"]


def parse_hash_partition(text: str) -> HashPartition:
    """ "3/12": partition 3 of 12 (ValueError otherwise)."""
    index, sep, count = text.partition("/")
    if not sep or not index.isdigit() or not count.isdigit():
        raise ValueError(f"expected INDEX/COUNT such as 3/12, got {text!r}")
    return HashPartition(int(index), int(count))


def encode_client(record: ClientRecord) -> bytes:
    """A client's registration, as a server of the cluster ID tells another that asks for it."""
    fields = attrs.asdict(record)
    fields["conn_id"] = record.conn_id.hex()
    return json.dumps(fields).encode()


def decode_client(payload: bytes) -> ClientRecord | None:
    try:
        data = json.loads(payload)
        return ClientRecord(
            str(data["client_id"]),
            str(data["hb_inbox"]),
            bytes.fromhex(str(data["conn_id"])),
            int(data["protocol"]),
            int(data["ping_interval"]),
            int(data["ping_max_out"]),
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


@attrs.frozen
class Claim:
    server: str  # the server's name, for the message that names the conflict
    token: str  # unique per process: its own claims are not a conflict
    started: float  # wall-clock time: the later of two overlapping servers gives way
    channels: tuple[str, ...]
    group: str = ""  # its fault-tolerance group: members of one group take over from each other

    def encode(self) -> bytes:
        return json.dumps(attrs.asdict(self)).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Claim | None:
        try:
            data = json.loads(payload)
            return cls(
                str(data["server"]),
                str(data["token"]),
                float(data["started"]),
                tuple(data["channels"]),
                str(data.get("group", "")),
            )
        except (ValueError, KeyError, TypeError, RecursionError):
            return None

    def newer_than(self, other: Claim) -> bool:
        return (self.started, self.token) > (other.started, other.token)


class Claims:
    """Announces this server's partition and watches for overlapping ones (see the module docstring)."""

    def __init__(self, bus: Bus, cluster_id: str, server_name: str, partition: Partition, group: str = "") -> None:
        self._bus = bus
        self.partition = partition
        self.subject = f"_STAN.partitions.{cluster_id}"
        self.mine = Claim(server_name, secrets.token_hex(8), time.time(), partition.patterns, group)
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

    def _on_claim(self, subject: str, reply: str, payload: bytes, origin: Origin) -> None:
        other = Claim.decode(payload)
        if other is None or other.token == self.mine.token:
            return
        if other.group and other.group == self.mine.group:
            return  # a member of this server's FT group (one that stepped down, or not yet): the log fences it
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
