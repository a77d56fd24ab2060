"""The delivery engine (sans-IO): what to send when, to whom, and what to remember.

It imports no Trio, no LMDB and no metrics code (import-linter checks this); time comes in as `now`.
"""

from streaming.core.engine.engine import Effects, Engine, SubscribeRequest, SubscriptionView, dead_letter_payload
from streaming.core.engine.events import (
    Acked,
    AckTimedOut,
    DeadLetter,
    DeadLettered,
    Delivered,
    Delivery,
    Event,
    ExpiredByLimit,
    MemberJoined,
    MemberLeft,
    Observer,
    Reason,
    SubRef,
    SubscriptionClosed,
    SubscriptionCreated,
    SubscriptionRemoved,
)
from streaming.core.errors import RequestError

__all__ = [
    "AckTimedOut",
    "Acked",
    "DeadLetter",
    "DeadLettered",
    "Delivered",
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
]
