"""Fault-tolerance groups for tests: member processes on a real nats-server cluster with JetStream,
node-nats-streaming under continuous load, and the checker run over everything they saw."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx

from bench.peers import NatsNode
from storage import Message, open_store
from tests.support.node import NODE_DIR
from tests.support.servers import ServerProcess, free_port, wait_for

STANDBY_LINE = r"is a standby \(log position"
CID = "test-cluster"


@attrs.define
class Member:
    """One member of a group: a `streaming-server --ft_group` process with a fixed monitoring port."""

    name: str
    data: Path
    process: ServerProcess
    http_port: int

    def serverz(self) -> dict[str, Any] | None:
        try:
            page: dict[str, Any] = httpx.get(f"http://127.0.0.1:{self.http_port}/streaming/serverz", timeout=1).json()
        except (httpx.HTTPError, ValueError):
            return None
        return page

    @property
    def state(self) -> str:
        page = self.serverz()
        return "" if page is None else str(page.get("state", ""))

    def start(self) -> Member:
        self.process.start(timeout=60)
        return self

    def alive(self) -> bool:
        return self.process.proc is not None and self.process.proc.poll() is None

    def signal(self, signum: int) -> None:
        assert self.process.proc is not None
        self.process.proc.send_signal(signum)


def member(
    name: str, nodes: list[NatsNode], root: Path, *, replicas: int = 3, lease: str = "2s", login: Sequence[str] = ()
) -> Member:
    """A member of group `main` on `nodes`; `login`: the flags it logs in to the cluster with."""
    port = free_port()
    urls = ",".join(n.url for n in nodes)
    data = root / name
    args = ["--nats_server", urls, "--ft_group", "main", "--ft_replicas", str(replicas), "--ft_lease", lease]
    args += ["--dir", str(data), "--server_name", name, "-m", str(port), "--recovery_hold", "1s"]
    args += ["--event_log", str(root / f"{name}-events"), *login]
    return Member(name, data, ServerProcess(args, ready=STANDBY_LINE), port)


@contextmanager
def group(nodes: list[NatsNode], root: Path, count: int = 2, *, replicas: int = 3) -> Iterator[list[Member]]:
    members = [member(f"m{i}", nodes, root, replicas=replicas) for i in range(count)]
    try:
        for m in members:
            m.start()
        yield members
    finally:
        for m in members:
            if m.alive():
                m.signal(signal.SIGCONT)
            m.process.stop()


def the_active(members: list[Member], within: float = 20.0) -> Member:
    """The one member serving, once exactly one says FT_ACTIVE."""
    found: list[Member] = []

    def one() -> bool:
        found[:] = [m for m in members if m.alive() and m.state == "FT_ACTIVE"]
        return len(found) == 1

    wait_for(one, within)
    return found[0]


def caught_up(standby: Member, active: Member, within: float = 20.0) -> None:
    """Wait until `standby`'s store holds every log record `active` has written."""

    def level() -> bool:
        a, s = active.serverz(), standby.serverz()
        return a is not None and s is not None and s["ft_applied"] >= a["ft_applied"] and s["ft_lag"] == 0

    wait_for(level, within)


class Load:
    """tests/node/ft_load.js: a publisher at `rate` messages a second and four subscribers, all acking."""

    def __init__(self, nodes: list[NatsNode], channel: str, rate: int = 200, *, max_ping_out: int = 3) -> None:
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            ["node", str(NODE_DIR / "ft_load.js"), channel, str(rate)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "NATS_SERVERS": ",".join(n.url for n in nodes),
                "STAN_MAX_PING_OUT": str(max_ping_out),
            },
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def acked(self) -> int:
        return sum(1 for e in list(self.events) if "a" in e)

    def wait_acked(self, count: int, within: float = 30.0) -> None:
        wait_for(lambda: self.acked() >= count, within)

    def stop(self) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        assert self.proc.stderr is not None
        assert any(e.get("done") for e in self.events), f"the load did not finish: {self.proc.stderr.read()}"
        return list(self.events)


def first_ack_after(events: list[dict[str, Any]], unix_ms: float) -> float:
    """Seconds from `unix_ms` to the first PubAck the load got after it."""
    after = [e["t"] for e in events if "a" in e and e["t"] > unix_ms]
    assert after, "no publish was acknowledged after the fault"
    return float(min(after) - unix_ms) / 1000


def stored(data: Path, channel: str) -> list[Message]:
    """Every message of `channel` in a stopped member's data directory."""
    with open_store("lmdb", data, CID, verify="quick") as store:
        info = store.channel_info(channel)
        return [] if info is None else store.read(channel, info.first_seq, 10_000_000)


@attrs.frozen
class Report:
    acked: int
    failed: int
    stored: int
    redelivered_acked: int  # deliveries again of messages a subscriber had acknowledged before


def stop_and_compare(load: Load, standby: Member, active: Member, channel: str) -> Report:
    """End a run: stop the load, let `standby` catch up with `active`, stop both; the checker over the
    whole run, and the standby's copy of `channel` must be the active's, byte for byte."""
    events = load.stop()
    caught_up(standby, active)
    standby.process.stop()
    active.process.stop()
    messages = stored(active.data, channel)
    report = check(events, messages)
    assert stored(standby.data, channel) == messages
    return report


def check(
    events: list[dict[str, Any]], messages: list[Message], windows: list[tuple[float, float]] | None = None
) -> Report:
    """What must hold over a whole run: every PubAck'd message stored exactly once, nothing stored
    twice, sequences without gaps or repeats, every subscriber got every message, no client lost its
    connection. With `windows` (unix ms, from shortly before each fault to when service was back): a
    message a subscriber had acknowledged comes to it again only if it acknowledged it inside one
    (an ack the active that died had not written to the log yet)."""
    acked = {e["a"] for e in events if "a" in e}
    failed = {e["f"] for e in events if "f" in e}
    seqs = [m.seq for m in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the channel's sequences have gaps or repeats"
    counts = collections.Counter(m.data.decode() for m in messages)
    assert [d for d, n in counts.items() if n > 1] == [], "messages stored twice"
    missing = [i for i in sorted(acked) if counts[f"p-{i}"] != 1]
    assert missing == [], f"{len(missing)} acknowledged publishes are not in the channel: {missing[:10]}"
    assert not [e for e in events if "lost" in e], "a STAN client lost its connection"
    everything = set(counts)
    for name in ("dur", "plain"):
        got = {e["d"] for e in events if e.get("s") == name}
        assert everything <= got, f"{name} missed {sorted(everything - got)[:10]}"
    queue = {e["d"] for e in events if e.get("s") in ("qa", "qb")}
    assert everything <= queue, f"the queue group missed {sorted(everything - queue)[:10]}"
    acked_at: dict[tuple[str, str], float] = {}  # (subscriber, data) -> when it was first acked
    again = 0
    outside: list[dict[str, Any]] = []
    for e in events:
        if "s" not in e:
            continue
        key = (e["s"] if e["s"] in ("dur", "plain") else "queue", e["d"])
        if key in acked_at:
            again += 1
            if windows is not None and not any(lo <= acked_at[key] <= hi for lo, hi in windows):
                outside.append(e)
        else:
            acked_at[key] = e["t"]  # the load acks each delivery as it arrives
    assert outside == [], f"acknowledged messages delivered again outside every fault's window: {outside[:5]}"
    return Report(len(acked), len(failed), len(messages), again)
