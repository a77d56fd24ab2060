"""The units the configuration file and the flags write values in: durations (seconds, or "30s",
"1m30s", "500ms", "24h" as nats-streaming-server writes them), sizes (bytes, or "64MB", "1GiB") and
booleans (TOML's, or the words Go's flags take). A module of its own, importing nothing of the
server, so that the `streaming` client command parses its flags without loading the server."""

from __future__ import annotations

import re
from typing import NewType

Duration = NewType("Duration", float)
Size = NewType("Size", int)

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE = re.compile(r"^(\d+)\s*([kmgt]?i?b?)$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_duration(value: object) -> float:
    """Seconds from 30, 2.5, "30s", "1m30s", "500ms", "24h"; "-1"/negative numbers pass through."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("-")
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sign * sum(float(n) * _UNITS[u] for n, u in parts)
    raise ValueError(f"expected a duration such as 30, '30s', '1m30s' or '500ms', got {value!r}")


_BOOLS = {"true": True, "t": True, "1": True, "false": False, "f": False, "0": False}


def parse_bool(value: object) -> bool:
    """A TOML boolean, or the words Go's flags take ("true", "false", "1", "0", "t", "f")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise ValueError(f"expected true or false, got {value!r}")


def parse_size(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        sign = -1 if text.startswith("-") else 1
        match = _SIZE.match(text.lstrip("-"))
        if match:
            return sign * int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    raise ValueError(f"expected a size in bytes such as 1048576 or '1MB', got {value!r}")
