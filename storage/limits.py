"""Retention limits: global defaults, per-channel overrides (literal or wildcard), and eviction planning.

Semantics follow NATS Streaming: in the global limits 0 means unlimited and negative values are a
configuration error; in a per-channel entry 0 means "inherit from the closest wider entry, then the
global value" and a negative value means unlimited. Eviction by count or size always keeps the newest
message; eviction by age may empty a channel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

NS_PER_S = 1_000_000_000


@attrs.frozen(slots=True)
class ChannelLimits:
    max_msgs: int = 0
    max_bytes: int = 0
    max_age_s: float = 0.0
    max_inactivity_s: float = 0.0  # enforced by the delivery engine: idle channels are deleted

    @property
    def max_age_ns(self) -> int:
        return int(self.max_age_s * NS_PER_S)


DEFAULT_CHANNEL_LIMITS = ChannelLimits(max_msgs=1_000_000, max_bytes=1_000_000 * 1024)


def _check_global(instance: StoreLimits, attribute: attrs.Attribute[ChannelLimits], value: ChannelLimits) -> None:
    for name in ("max_msgs", "max_bytes", "max_age_s", "max_inactivity_s"):
        if getattr(value, name) < 0:
            raise ValueError(f"global limit {name} must be >= 0 (0 = unlimited), got {getattr(value, name)}")


def _check_patterns(
    instance: StoreLimits, attribute: attrs.Attribute[Mapping[str, ChannelLimits]], value: Mapping[str, ChannelLimits]
) -> None:
    for pattern in value:
        tokens = pattern.split(".")
        if not pattern or any(t == "" for t in tokens):
            raise ValueError(f"per-channel limit for {pattern!r}: not a valid channel name or pattern")
        for i, token in enumerate(tokens):
            if token == ">" and i != len(tokens) - 1:
                raise ValueError(f"per-channel limit for {pattern!r}: '>' must be the last token")
            if token not in ("*", ">") and ("*" in token or ">" in token):
                raise ValueError(f"per-channel limit for {pattern!r}: wildcards must be whole tokens")


@attrs.frozen
class StoreLimits:
    """Limits for the whole store. `max_subs` is enforced by the delivery engine, the rest here."""

    max_channels: int = 100
    max_subs: int = 1000
    channel: ChannelLimits = attrs.field(default=DEFAULT_CHANNEL_LIMITS, validator=_check_global)
    per_channel: Mapping[str, ChannelLimits] = attrs.field(factory=dict, validator=_check_patterns)
    _resolved: dict[str, ChannelLimits] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def for_channel(self, name: str) -> ChannelLimits:
        """The effective limits of one channel, with 0 meaning unlimited."""
        found = self._resolved.get(name)
        if found is None:
            if len(self._resolved) > 10_000:
                self._resolved.clear()
            found = self._resolved[name] = _resolve(self, name)
        return found


def pattern_matches(pattern: str, name: str) -> bool:
    p, n = pattern.split("."), name.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(n) > i
        if i >= len(n) or (token != "*" and token != n[i]):
            return False
    return len(p) == len(n)


def _specificity(pattern: str) -> tuple[int, int, int]:
    tokens = pattern.split(".")
    literal = sum(1 for t in tokens if t not in ("*", ">"))
    return (literal == len(tokens), literal, -int(tokens[-1] == ">"))


def _resolve(limits: StoreLimits, name: str) -> ChannelLimits:
    matching = sorted((p for p in limits.per_channel if pattern_matches(p, name)), key=_specificity, reverse=True)
    chain = [limits.per_channel[p] for p in matching] + [limits.channel]

    def pick(field: str) -> float:
        for entry in chain:
            value: float = getattr(entry, field)
            if value != 0:
                return max(value, 0)
        return 0

    return ChannelLimits(
        max_msgs=int(pick("max_msgs")),
        max_bytes=int(pick("max_bytes")),
        max_age_s=float(pick("max_age_s")),
        max_inactivity_s=float(pick("max_inactivity_s")),
    )


def plan_eviction(
    limits: ChannelLimits,
    msgs: int,
    total_bytes: int,
    oldest_first: Iterable[tuple[int, int]],
    now_unix_ns: int,
) -> tuple[int, int]:
    """How many of the oldest messages to drop, and their total size.

    `oldest_first` yields (size, timestamp_unix_ns) from the oldest message on; it is consumed only
    as far as needed, so a store can feed it from a cursor.
    """
    age_cutoff = now_unix_ns - limits.max_age_ns if limits.max_age_s > 0 else None
    dropped = freed = 0
    for size, timestamp in oldest_first:
        remaining = msgs - dropped
        too_old = age_cutoff is not None and timestamp <= age_cutoff
        over = remaining > 1 and (
            (limits.max_msgs > 0 and remaining > limits.max_msgs)
            or (limits.max_bytes > 0 and total_bytes - freed > limits.max_bytes)
        )
        if not (too_old or over):
            break
        dropped += 1
        freed += size
    return dropped, freed
