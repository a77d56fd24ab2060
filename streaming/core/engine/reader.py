"""Where the engine gets message bodies: the batch just appended (handed over by the commit
pipeline, so new messages are never read back), a cache of messages read lately, and the store for
the rest (one read per batch, never one per message).

The cache is what makes fan-out cheap: subscriptions reading one channel's backlog side by side, or
a message redelivered to many subscriptions, read and verify each stored message once, not once per
subscription. It holds two generations of up to `_GENERATION` messages (and `_GENERATION_BYTES` of
payload) each: when the newer one fills up it becomes the older and the older is dropped, so a lookup
is two dict probes and the bound holds without a per-message eviction.
"""

from __future__ import annotations

from collections.abc import Sequence

from storage.base import Store
from storage.records import Message

_GENERATION = 8192
_GENERATION_BYTES = 16 << 20


class MessageReader:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._recent: dict[str, tuple[int, Sequence[Message]]] = {}  # channel -> just-appended messages
        self._new: dict[tuple[str, int], Message] = {}
        self._old: dict[tuple[str, int], Message] = {}
        self._new_bytes = 0

    def hold_appended(self, channel: str, messages: Sequence[Message]) -> None:
        """Serve reads of these (consecutive) messages from memory until `release_appended`."""
        if messages:
            self._recent[channel] = (messages[0].seq, messages)

    def release_appended(self, channel: str) -> None:
        self._recent.pop(channel, None)

    def forget(self) -> None:
        """Messages were dropped (limits) or a channel deleted: nothing cached may be served again."""
        self._new = {}
        self._old = {}
        self._new_bytes = 0

    def read(self, channel: str, start: int, count: int) -> Sequence[Message]:
        """Up to `count` messages from `start` on, in order (gaps the store left are skipped)."""
        recent = self._recent.get(channel)
        if recent is not None:
            first, messages = recent
            if first <= start < first + len(messages) and messages[start - first].seq == start:
                return messages[start - first : start - first + count]
        new, old = self._new, self._old
        out: list[Message] = []
        seq = start
        while len(out) < count:  # what another subscription read lately: no store read, no check
            found = new.get((channel, seq)) or old.get((channel, seq))
            if found is None:
                break
            out.append(found)
            seq += 1
        if len(out) < count:
            read = self.store.read(channel, seq, count - len(out))
            self._keep(channel, read)
            out += read
        return out

    def read_many(self, channel: str, seqs: list[int]) -> list[Message | None]:
        """Messages for redelivery, from memory where possible; the rest from the store in one read
        (one transaction, not one per message)."""
        out: list[Message | None] = [None] * len(seqs)
        missing: list[int] = []
        recent = self._recent.get(channel)
        first, held = recent if recent is not None else (0, [])
        new, old = self._new, self._old
        for i, seq in enumerate(seqs):
            if first <= seq < first + len(held):
                out[i] = held[seq - first]
            else:
                found = new.get((channel, seq)) or old.get((channel, seq))
                if found is None:
                    missing.append(i)
                else:
                    out[i] = found
        if missing:
            read = self.store.get_many(channel, [seqs[i] for i in missing])
            for i, message in zip(missing, read, strict=True):
                out[i] = message
            self._keep(channel, [m for m in read if m is not None])
        return out

    def _keep(self, channel: str, messages: Sequence[Message]) -> None:
        size = sum(len(m.data) for m in messages)
        if len(self._new) + len(messages) > _GENERATION or self._new_bytes + size > _GENERATION_BYTES:
            self._old, self._new, self._new_bytes = self._new, {}, 0
        new = self._new
        for message in messages:
            new[(channel, message.seq)] = message
        self._new_bytes += size
