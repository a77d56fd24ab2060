"""The delivery engine (sans-IO): what to send when, to whom, and what to remember.

It imports no Trio, no LMDB and no metrics code (import-linter checks this); time comes in as `now`.

- `engine`: the rules (subscribe, deliver, ack, redeliver, leave), one state machine;
- `effects`: what its calls leave to do, until the commit pipeline takes it;
- `state`: what it holds per subscription, queue group (and who gets the next message) and client;
- `pending`: one subscription's unacked messages; `reader`: where message bodies come from;
- `activity`: channel inactivity (MaxInactivity); `inspection`: read-only queries for tests;
- `recovery`: rebuilding it after a restart; `events`: what it tells observers (metrics, event log).
"""

from streaming.core.engine.effects import Effects
from streaming.core.engine.engine import MAX_NAK_DELAY_S, Engine
from streaming.core.engine.events import (
    Acked,
    AckedRun,
    AckTimedOut,
    DeadLetter,
    DeadLettered,
    Delivered,
    DeliveredRun,
    Delivery,
    Event,
    ExpiredByLimit,
    MemberJoined,
    MemberLeft,
    Naked,
    Observer,
    Reason,
    SubRef,
    SubscriptionClosed,
    SubscriptionCreated,
    SubscriptionRemoved,
    dead_letter_payload,
    per_message,
)
from streaming.core.engine.recovery import recover
from streaming.core.engine.state import SubscribeRequest, SubscriptionView
from streaming.core.errors import RequestError

__all__ = [
    "MAX_NAK_DELAY_S",
    "AckTimedOut",
    "Naked",
    "Acked",
    "AckedRun",
    "DeadLetter",
    "DeadLettered",
    "Delivered",
    "DeliveredRun",
    "Delivery",
    "Effects",
    "Engine",
    "Event",
    "ExpiredByLimit",
    "MemberJoined",
    "MemberLeft",
    "Observer",
    "Reason",
    "RequestError",
    "SubRef",
    "SubscribeRequest",
    "SubscriptionClosed",
    "SubscriptionCreated",
    "SubscriptionRemoved",
    "SubscriptionView",
    "dead_letter_payload",
    "per_message",
    "recover",
]
