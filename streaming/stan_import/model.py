"""What an importer reads out of a nats-streaming-server store, whichever kind (file or SQL): its
server record, registered clients, and per channel its bounds, messages (streamed) and subscriptions
(replayed to their last state)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import attrs

from storage import Message
from streaming.stan_import.framing import Crc32
from streaming.stan_import.spb.store_pb2 import ClientInfo, ServerInfo, SubState


@attrs.define(slots=True)
class StanSubscription:
    """A subscription as the server would recover it: its last state and its unacknowledged sequences."""

    state: SubState
    pending: set[int] = attrs.Factory(set)

    @property
    def durable_name(self) -> str:
        """The durable's name (for a durable queue group, the part of its stored group before ':')."""
        if self.state.qGroup and self.state.isDurable and ":" in self.state.qGroup:
            return self.state.qGroup.split(":", 1)[0]
        return self.state.durableName

    @property
    def queue_group(self) -> str:
        """The queue group's name as its members gave it (a durable group is stored as 'durable:group')."""
        if self.state.qGroup and self.state.isDurable and ":" in self.state.qGroup:
            return self.state.qGroup.split(":", 1)[1]
        return self.state.qGroup

    @property
    def is_durable(self) -> bool:
        return self.state.isDurable or bool(self.state.durableName)  # old stores lack isDurable


Progress = Callable[[int], None]  # told how many more messages were read
RECORD_OVERHEAD = 40  # what the server counts per message beyond its record, against max_bytes


@attrs.frozen
class ReadOptions:
    crc_poly: int | None = None  # None: IEEE
    verify_crc: bool = True
    drop_partial_tail: bool = False
    encryption_key: bytes | None = None

    def crc(self) -> Crc32 | None:
        if not self.verify_crc:
            return None
        return Crc32() if self.crc_poly is None else Crc32(self.crc_poly)


class RefusedError(Exception):
    """The store cannot be imported as asked (the message says why and what to do)."""


class MessageStream(Protocol):
    def __call__(self, progress: Progress | None = None) -> Iterator[Message]: ...


@attrs.define(slots=True)
class StanChannel:
    """One channel. `messages(progress)` streams them in order (each call reads the files again), and
    raises at the end for payloads that all look encrypted when no key was given; the bounds are known
    when it is made, from the index files or a scan of the data files."""

    name: str
    first_seq: int  # with no message left, last_seq + 1
    last_seq: int
    msgs: int
    bytes: int  # as nats-streaming-server counts them (payload plus 40 bytes of record overhead)
    subscriptions: list[StanSubscription]
    messages: MessageStream


@attrs.define(slots=True)
class StanStore:
    server: ServerInfo
    clients: dict[str, ClientInfo]
    channels: list[StanChannel]
    notes: list[str] = attrs.Factory(list)  # what the reader noticed and did, one line each (grows as it reads)
