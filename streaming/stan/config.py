"""The STAN front door's settings (the server's configuration maps onto these)."""

from __future__ import annotations

import attrs


@attrs.frozen
class StanConfig:
    cluster_id: str = "test-cluster"
    discover_prefix: str = "_STAN.discover"
    hb_interval_s: float = 30.0
    hb_timeout_s: float = 10.0
    hb_fail_count: int = 10
    dup_check_timeout_s: float = 0.5
    wildcard_subscriptions: bool = True  # subscriptions to a pattern (our extension)
    allow_ms_ack_wait: bool = False  # test-only: a negative ackWaitInSecs is milliseconds
