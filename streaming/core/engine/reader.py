"""Where the engine gets message bodies: the batch just appended (handed over by the commit
pipeline, so new messages are never read back), a small cache of recently redelivered messages (a
message redelivered to many subscriptions is read once), and the store for the rest (one read per
batch, never one per message)."""

from __future__ import annotations

from collections.abc import Sequence

from storage.base import Store
from storage.records import Message

_CACHE_LIMIT = 4096


class MessageReader:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._recent: dict[str, tuple[int, Sequence[Message]]] = {}  # channel -> just-appended messages
        self._cache: dict[tuple[str, int], Message] = {}  # recently redelivered messages

    def hold_appended(self, channel: str, messages: Sequence[Message]) -> None:
        """Serve reads of these (consecutive) messages from memory until `release_appended`."""
        if messages:
            self._recent[channel] = (messages[0].seq, messages)

    def release_appended(self, channel: str) -> None:
        self._recent.pop(channel, None)

    def forget(self) -> None:
        """Messages were dropped (limits) or a channel deleted: nothing cached may be served again."""
        self._cache.clear()

    def read(self, channel: str, start: int, count: int) -> Sequence[Message]:
        recent = self._recent.get(channel)
        if recent is not None:
            first, messages = recent
            if first <= start < first + len(messages) and messages[start - first].seq == start:
                return messages[start - first : start - first + count]
        return self.store.read(channel, start, count)

    def read_one(self, channel: str, seq: int) -> Message | None:
        return self.read_many(channel, [seq])[0]

    def read_many(self, channel: str, seqs: list[int]) -> list[Message | None]:
        """Messages for redelivery, from memory where possible; the rest from the store in one read
        (one transaction, not one per message), kept so that redeliveries of one message to many
        subscriptions (fan-out) read it once."""
        out: list[Message | None] = [None] * len(seqs)
        missing: list[int] = []
        recent = self._recent.get(channel)
        first, held = recent if recent is not None else (0, [])
        cache = self._cache
        for i, seq in enumerate(seqs):
            if first <= seq < first + len(held):
                out[i] = held[seq - first]
            else:
                found = cache.get((channel, seq))
                if found is None:
                    missing.append(i)
                else:
                    out[i] = found
        if missing:
            for i, message in zip(missing, self.store.get_many(channel, [seqs[i] for i in missing]), strict=True):
                out[i] = message
                if message is not None:
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    cache[(channel, message.seq)] = message
        return out
