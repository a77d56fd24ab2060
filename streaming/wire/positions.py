"""Where a new subscription starts: the STAN protocol's start positions, in one definition shared by the
client library, the server and its store (which persists them with each subscription)."""

from __future__ import annotations

import enum


class StartPosition(enum.IntEnum):
    """Where a new subscription starts (numbers are the STAN protobuf enum values)."""

    NEW_ONLY = 0
    LAST_RECEIVED = 1
    TIME_DELTA_START = 2
    SEQUENCE_START = 3
    FIRST = 4
