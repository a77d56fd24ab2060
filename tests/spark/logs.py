"""Small hand-made event logs for the Spark tests: helpers that spell events briefly, and a log with
a storm whose figures the tests work out by hand."""

from __future__ import annotations

from typing import Any

from spark.synthetic import SECOND, record

T0 = 1_800_000_000 * SECOND  # a whole minute, so windows and buckets start on it


def s(seconds: float) -> int:
    return T0 + round(seconds * SECOND)


def deliver(t: float, seq: int, *, sub: int = 1, attempt: int = 1, reason: str = "new", **kw: Any) -> dict[str, Any]:
    kw.setdefault("channel", "orders")
    kw.setdefault("member", f"client-{sub}")
    kw.setdefault("ack_wait_s", 30.0)
    return record(s(t), "deliver", seq=seq, sub=sub, attempt=attempt, reason=reason, **kw)


def ack(t: float, seq: int, *, sub: int = 1, attempt: int = 1, **kw: Any) -> dict[str, Any]:
    kw.setdefault("channel", "orders")
    kw.setdefault("member", f"client-{sub}")
    return record(s(t), "ack", seq=seq, sub=sub, attempt=attempt, **kw)


def storm_log() -> list[dict[str, Any]]:
    """60 buckets of 10 s, 10 new messages each, acked 50 ms later. Quiet buckets redeliver 2 of
    their messages once; buckets 40-45 redeliver each of their 10 messages 5 times (attempts 2-6)."""
    out: list[dict[str, Any]] = []
    for b in range(60):
        storm = 40 <= b <= 45
        for j in range(10):
            seq = b * 10 + j + 1
            out.append(deliver(b * 10 + j * 0.1, seq))
            if storm:
                for k in range(5):
                    out.append(deliver(b * 10 + 1 + k + j * 0.01, seq, attempt=k + 2, reason="ack_timeout"))
                out.append(ack(b * 10 + 9.5, seq, attempt=6))
            else:
                if j < 2:
                    out.append(deliver(b * 10 + 5 + j * 0.1, seq, attempt=2, reason="ack_timeout"))
                out.append(ack(b * 10 + j * 0.1 + 0.05 + (5 if j < 2 else 0), seq, attempt=2 if j < 2 else 1))
    return out
