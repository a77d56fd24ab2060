"""Synthetic delivery event logs with a known shape, for the Spark tests and `bench/spark_scale.py`:
lines in the server's own format (`streaming.observability.event_schema`), written fast enough for millions."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from streaming.observability.event_schema import FIELDS

SECOND = 1_000_000  # microseconds


def record(ts: int, event: str, **fields: Any) -> dict[str, Any]:
    """One event with every field of the schema, in its order (null where not given)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"not in the schema: {sorted(unknown)}")
    return {name: {"ts": ts, "event": event}.get(name, fields.get(name)) for name in FIELDS}


def write(path: Path, records: Iterable[dict[str, Any]], extra_lines: Iterable[str] = ()) -> Path:
    """Write `records` (and raw `extra_lines`, e.g. malformed ones) as one JSON Lines file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path


def steady_with_storm(
    path: Path,
    events: int,
    *,
    start_us: int = 1_800_000_000 * SECOND,
    rate: float = 20_000.0,
    members: int = 4,
    ack_wait_s: float = 5.0,
    storm: tuple[float, float] = (0.4, 0.5),
) -> dict[str, int]:
    """About `events` events of one channel consumed by a queue group of `members`, `rate` messages a
    second, each published, delivered and acked 5 ms later; for messages in the `storm` fraction of
    the run two of every three are not acked in time: an ack_timeout and a redelivery to the next
    member, acked 10 ms after. Plus one server start. Returns the counts of what it wrote."""
    step = round(SECOND / rate)
    aw = round(ack_wait_s * SECOND)
    # ~3 events per message, 5 in the storm fraction.
    frac = storm[1] - storm[0]
    messages = max(1, round(events / (3 + 2 * frac * 2 / 3)))
    lo, hi = round(messages * storm[0]), round(messages * storm[1])
    counts = {"publish": 0, "deliver": 0, "ack": 0, "ack_timeout": 0, "redelivered": 0}
    head = '"channel":"orders","seq":'
    nothing = ',"last_seq":null,"sub":null,"group":null,"member":null,"attempt":null,"ack_wait_s":null,"reason":null}\n'
    ack_1 = '"attempt":1,"ack_wait_s":null,"reason":null}\n'
    ack_2 = '"attempt":2,"ack_wait_s":null,"reason":null}\n'
    first = f'"attempt":1,"ack_wait_s":{ack_wait_s!r},"reason":"new"}}\n'
    expired = f'"attempt":1,"ack_wait_s":{ack_wait_s!r},"reason":null}}\n'
    again = f'"attempt":2,"ack_wait_s":{ack_wait_s!r},"reason":"ack_timeout"}}\n'
    tails = [f',"last_seq":null,"sub":{m + 1},"group":"workers","member":"worker-{m}",' for m in range(members)]

    def lines() -> Iterator[str]:
        yield f'{{"ts":{start_us - SECOND},"event":"server_start","channel":null,"seq":null{nothing}'
        for i in range(messages):
            seq = i + 1
            ts = start_us + i * step
            tail = tails[i % members]
            yield f'{{"ts":{ts},"event":"publish",{head}{seq}{nothing}'
            yield f'{{"ts":{ts + 100},"event":"deliver",{head}{seq}{tail}{first}'
            if lo <= i < hi and i % 3:
                t2 = ts + 100 + aw
                tail2 = tails[(i + 1) % members]
                yield f'{{"ts":{t2},"event":"ack_timeout",{head}{seq}{tail}{expired}'
                yield f'{{"ts":{t2},"event":"deliver",{head}{seq}{tail2}{again}'
                yield f'{{"ts":{t2 + 10_000},"event":"ack",{head}{seq}{tail2}{ack_2}'
                counts["ack_timeout"] += 1
                counts["redelivered"] += 1
                counts["deliver"] += 2
            else:
                yield f'{{"ts":{ts + 5_100},"event":"ack",{head}{seq}{tail}{ack_1}'
                counts["deliver"] += 1
            counts["publish"] += 1
            counts["ack"] += 1

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        batch: list[str] = []
        for line in lines():
            batch.append(line)
            if len(batch) >= 65_536:
                f.write("".join(batch))
                batch.clear()
        f.write("".join(batch))
    counts["events"] = 1 + counts["publish"] + counts["deliver"] + counts["ack"] + counts["ack_timeout"]
    return counts
