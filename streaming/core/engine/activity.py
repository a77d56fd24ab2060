"""Channel inactivity (MaxInactivity): when each channel was last active, and which have been idle for
their limit. A channel is active while it has an online subscription or an online queue-group member
(offline durables and empty durable groups do not count), and each publish makes it active again."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from storage.base import Store


class ChannelActivity:
    def __init__(self, store: Store, has_active_subscriptions: Callable[[str], bool]) -> None:
        self._store = store
        self._active = has_active_subscriptions
        self._since: dict[str, float] = {}  # channel -> last publish, or when its last active sub left

    def touched(self, channel: str, now: float) -> None:
        """A publish to `channel`, or its last active subscription left: the idle clock starts now."""
        self._since[channel] = now

    def forget(self, channel: str) -> None:
        self._since.pop(channel, None)

    def _deadlines(self, now: float) -> Iterator[tuple[str, float]]:
        """(channel, when it may be deleted) for channels with a MaxInactivity and no active subscription."""
        for info in self._store.channels():
            limit = self._store.limits.for_channel(info.name).max_inactivity_s
            if limit > 0 and not self._active(info.name):
                yield info.name, self._since.setdefault(info.name, now) + limit

    def inactive(self, now: float) -> list[str]:
        """Channels idle for their MaxInactivity: no active subscription and no publish for that long."""
        return [name for name, due in self._deadlines(now) if now >= due]

    def next_check(self, now: float) -> float | None:
        """When the next channel could become idle enough to delete (None: no channel has the limit)."""
        return min((due for _, due in self._deadlines(now)), default=None)
