"""The channel limits of a nats-streaming-server configuration file, and what they remove from a channel
at import, as the server applies them when it starts on its store (a file store does not keep them).

The file is in nats-server's configuration format (`streaming { store_limits { max_msgs: 100
channels { "orders.*": { max_age: "24h" } } } }`, or the same keys at the top level), read by
`streaming.stan_import.natsconf`. Globally 0 means unlimited; per channel 0 or a negative value means
unlimited for that channel, and a limit not given is inherited from the closest wider entry, then
the global one (storage.limits resolves them the same way).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from storage import ChannelLimits, Message, StoreLimits
from streaming.stan_import.model import RECORD_OVERHEAD, StanChannel
from streaming.stan_import.natsconf import ConfFormatError, parse_duration_s, parse_file
from streaming.wire.stan_pb.protocol_pb2 import MsgProto

_NAMES = {
    "mm": "max_msgs",
    "max_msgs": "max_msgs",
    "maxmsgs": "max_msgs",
    "max_count": "max_msgs",
    "maxcount": "max_msgs",
    "mb": "max_bytes",
    "max_bytes": "max_bytes",
    "maxbytes": "max_bytes",
    "ma": "max_age",
    "max_age": "max_age",
    "maxage": "max_age",
    "mi": "max_inactivity",
    "max_inactivity": "max_inactivity",
    "maxinactivity": "max_inactivity",
    "msu": "max_subs",
    "max_subs": "max_subs",
    "max_subscriptions": "max_subs",
    "maxsubscriptions": "max_subs",
}


class StanConfigError(Exception):
    """The STAN configuration file cannot be read, or its limits are not what the server accepts."""


@attrs.frozen
class Cut:
    """What the limits remove from the front of one channel, as its messages go by."""

    why: str  # the limits that apply ("" if none)
    msgs: int
    bytes: int
    max_msgs: int = 0  # 0: no such limit
    max_bytes: int = 0
    older_than_unix_ns: int = 0

    def apply(self, messages: Iterator[Message]) -> Iterator[Message]:
        """The messages kept: the oldest go while the channel is over max_msgs or max_bytes (the newest
        always stays), then every one older than max_age (which can empty it)."""
        left, left_bytes = self.msgs, self.bytes
        for m in messages:
            over = (self.max_msgs and left > self.max_msgs) or (self.max_bytes and left_bytes > self.max_bytes)
            if (over and left > 1) or m.timestamp_unix_ns < self.older_than_unix_ns:
                left -= 1
                if self.max_bytes:
                    left_bytes -= _stan_size(m)
                continue
            yield m


def _stan_size(m: Message) -> int:
    """A message's size as the server counts it against max_bytes (its record and the overhead)."""
    msg = MsgProto(sequence=m.seq, subject=m.subject, reply=m.reply, data=m.data, timestamp=m.timestamp_unix_ns)
    return msg.ByteSize() + RECORD_OVERHEAD


@attrs.frozen
class Retention:
    """The limits of a STAN config file, as our StoreLimits (the same resolution rules)."""

    limits: StoreLimits
    now_unix_ns: int = attrs.field(factory=time.time_ns)

    def as_toml(self) -> str:
        """The same limits in this server's config file (its `[limits]` and `[channels."..."]`, which
        resolve as the server's did), so that they keep applying once it runs."""
        lines = [f"max_channels = {self.limits.max_channels}", f"max_subs = {self.limits.max_subs}", "", "[limits]"]
        lines += _toml_limits(self.limits.channel)
        for pattern, limits in sorted(self.limits.per_channel.items()):
            lines += ["", f"[channels.{json.dumps(pattern)}]", *_toml_limits(limits)]
        return "\n".join(lines) + "\n"

    def cut(self, channel: StanChannel) -> Cut:
        """What starting nats-streaming-server with these limits would remove from `channel`."""
        lim = self.limits.for_channel(channel.name)
        max_msgs = lim.max_msgs if lim.max_msgs and channel.msgs > lim.max_msgs else 0
        max_bytes = lim.max_bytes if lim.max_bytes and channel.bytes > lim.max_bytes else 0
        older = self.now_unix_ns - lim.max_age_ns if lim.max_age_s else 0
        reasons = [
            f"over max_msgs {max_msgs}" if max_msgs else "",
            f"over max_bytes {max_bytes}" if max_bytes else "",
            f"older than max_age {lim.max_age_s:g} s" if older else "",
        ]
        return Cut(", ".join(r for r in reasons if r), channel.msgs, channel.bytes, max_msgs, max_bytes, older)


def _toml_limits(limits: ChannelLimits) -> list[str]:
    values = [
        ("max_msgs", limits.max_msgs),
        ("max_bytes", limits.max_bytes),
        ("max_age", limits.max_age_s),
        ("max_inactivity", limits.max_inactivity_s),
    ]
    return [f"{name} = {value}" for name, value in values if value]


def load_retention(path: str | Path) -> Retention:
    """The store limits of a nats-streaming-server config file."""
    try:
        tree = parse_file(Path(path))
    except (OSError, ConfFormatError) as exc:
        raise StanConfigError(f"{path}: {exc}") from None
    section = next((v for k, v in tree.items() if k.lower() == "streaming"), tree)
    if not isinstance(section, dict):
        raise StanConfigError(f"{path}: the streaming section is not a map")
    found: Any = next((v for k, v in section.items() if k.lower() in ("limits", "store_limits", "storelimits")), {})
    if not isinstance(found, dict):
        raise StanConfigError(f"{path}: store_limits is not a map")
    try:
        return Retention(_limits(found))
    except (ValueError, TypeError) as exc:
        raise StanConfigError(f"{path}: store_limits: {exc}") from None


def _limits(found: dict[str, Any]) -> StoreLimits:
    # nats-streaming-server's defaults where the file says nothing (ours are the same figures).
    values: dict[str, Any] = {"max_msgs": 1_000_000, "max_bytes": 1024 * 1024 * 1000, "max_age": 0.0}
    max_channels, max_subs = 100, 1000
    per_channel: dict[str, ChannelLimits] = {}
    for key, value in found.items():
        name = key.lower()
        if name in ("mc", "max_channels", "maxchannels"):
            max_channels = _int(key, value)
        elif name in ("channels", "channels_limits", "channelslimits", "per_channel", "per_channel_limits"):
            if not isinstance(value, dict):
                raise ValueError(f"{key} is not a map of channel names to limits")
            for channel, limits in value.items():
                if not isinstance(limits, dict):
                    raise ValueError(f"{key}.{channel} is not a map of limits")
                per_channel[channel] = _channel(limits, per_channel=True)
        elif _NAMES.get(name) == "max_subs":
            max_subs = _int(key, value)
        elif name in _NAMES:
            values[_NAMES[name]] = _value(key, value)
    glob = ChannelLimits(values["max_msgs"], values["max_bytes"], values["max_age"], values.get("max_inactivity", 0.0))
    return StoreLimits(max_channels=max_channels, max_subs=max_subs, channel=glob, per_channel=per_channel)


def _channel(limits: dict[str, Any], *, per_channel: bool) -> ChannelLimits:
    values: dict[str, Any] = {}
    for key, value in limits.items():
        name = _NAMES.get(key.lower())
        if name is None or name == "max_subs":
            continue
        got = _value(key, value)
        values[name] = -1 if per_channel and got == 0 else got  # 0 in a channel's entry: unlimited
    return ChannelLimits(
        values.get("max_msgs", 0),
        values.get("max_bytes", 0),
        values.get("max_age", 0.0),
        values.get("max_inactivity", 0.0),
    )


def _value(key: str, value: Any) -> Any:
    name = _NAMES[key.lower()]
    if name in ("max_age", "max_inactivity"):
        if not isinstance(value, str):
            raise ValueError(f'{key} must be a duration in quotes such as "24h", not {value!r}')
        return parse_duration_s(value)
    return _int(key, value)


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be a number, not {value!r}")
    return value
