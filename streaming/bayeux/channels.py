"""Bayeux channel names and the engine channels they map to.

Wildcard channels map to engine patterns (`pattern_to_engine`): `/chat/*` to `chat.*`, `/chat/**`
to `chat.>`, which a wildcard subscription follows; its messages come on their own channels.

A concrete Bayeux channel `/orders/eu` is the engine channel `orders.eu`: each segment becomes one
token. Segment characters other than letters, digits, `_` and `-` are written `~XX` (two upper-case
hex digits of the character), so `.` inside a segment, `~` itself, spaces and NATS wildcards never
clash with the token structure. The mapping is injective and its inverse is exact, so a STAN client
publishing to `orders.eu` reaches a CometD subscriber of `/orders/eu` and the other way round.
"""

from __future__ import annotations

import functools
import re
from typing import Final

# CometD's channel alphabet: letters, digits and ` !#$()*+-./@_{~}` (space included).
_VALID: Final = re.compile(r"/[A-Za-z0-9 !#$()*+\-./@_{}~]+")
_PLAIN: Final = re.compile(r"[A-Za-z0-9_-]")
_ESCAPED: Final = re.compile(r"~([0-9A-F]{2})")


# The same few names come with every message of a busy client: each check and mapping is made once.
@functools.lru_cache(maxsize=4096)
def _valid(channel: str) -> bool:
    return len(channel) >= 2 and _VALID.fullmatch(channel) is not None


def valid(channel: object) -> bool:
    """Whether a Bayeux client may name this channel at all (CometD's validator)."""
    return isinstance(channel, str) and _valid(channel)


def segments(channel: str) -> list[str]:
    return channel[1:].split("/")


def is_meta(channel: str) -> bool:
    return channel == "/meta" or channel.startswith("/meta/")


def is_service(channel: str) -> bool:
    return channel == "/service" or channel.startswith("/service/")


def is_wildcard(channel: str) -> bool:
    return segments(channel)[-1] in ("*", "**")


@functools.lru_cache(maxsize=4096)
def mappable(channel: str) -> bool:
    """A concrete channel with an engine name: no empty segment, no wildcard."""
    parts = segments(channel)
    return all(parts) and parts[-1] not in ("*", "**")


@functools.lru_cache(maxsize=4096)
def pattern_to_engine(channel: str) -> str | None:
    """A wildcard channel's engine pattern: `/chat/*` (one segment below) -> `chat.*`, `/chat/**` (any
    depth below) -> `chat.>` (`/**`: every channel); None when it is no wildcard a subscription can
    follow (an empty segment)."""
    parts = segments(channel)
    if parts[-1] not in ("*", "**") or not all(parts[:-1]):
        return None
    return ".".join([*(_escape(s) for s in parts[:-1]), "*" if parts[-1] == "*" else ">"])


def _escape(segment: str) -> str:
    return "".join(c if _PLAIN.match(c) else f"~{ord(c):02X}" for c in segment)


@functools.lru_cache(maxsize=4096)
def to_engine(channel: str) -> str:
    """`/orders/eu` -> `orders.eu`; only for channels that are `valid` and `mappable`."""
    return ".".join(_escape(s) for s in segments(channel))


def from_engine(name: str) -> str:
    """The inverse of `to_engine`."""
    return "/" + "/".join(_ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), t) for t in name.split("."))
