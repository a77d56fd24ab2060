"""Prometheus metrics of one server: counters and histograms fed by the engine's and the group commit's
observer interfaces, and gauges read from the server's state at scrape time.

Names carry one prefix (`streaming_`), base units, and `_total` on counters. Labels are only `channel`
and `group` (queue group, else durable name, else empty), plus fixed sets (`reason`, `kind`, `env`):
all bounded by the server's limits. Client ids, inboxes and sequences go to the event log instead.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from streaming.core.engine import (
    Acked,
    AckTimedOut,
    DeadLettered,
    Delivered,
    Event,
    MemberJoined,
    MemberLeft,
)
from streaming.running import Running
from streaming.stan.broker import PROTOCOL_ERROR_KINDS
from streaming.stan.server import REFUSAL_KINDS

PREFIX = "streaming"
# Ack latency reaches past the largest AckWait users set (minutes), so late acks land in a bucket.
ACK_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 20, 50, 100)
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


def version() -> str:
    try:
        return metadata.version("streaming-server")
    except metadata.PackageNotFoundError:
        return "unknown"


class Metrics:
    """Owns a registry (one per server, so several servers in one test process do not clash)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Info(f"{PREFIX}_build", "Version of the server", registry=r).info(
            {"version": version(), "python": platform.python_version()}
        )
        ProcessCollector(registry=r)
        self.published_messages = Counter(
            f"{PREFIX}_published_messages", "Messages stored by publishes", ["channel"], registry=r
        )
        self.published_bytes = Counter(
            f"{PREFIX}_published_bytes", "Payload bytes stored by publishes", ["channel"], registry=r
        )
        self.deliveries = Counter(
            f"{PREFIX}_deliveries",
            "Messages sent to subscribers, by why they were sent",
            ["channel", "group", "reason"],
            registry=r,
        )
        self.acks = Counter(f"{PREFIX}_acks", "Acknowledgements applied", ["channel", "group"], registry=r)
        self.ack_timeouts = Counter(
            f"{PREFIX}_ack_timeouts",
            "Deliveries whose AckWait expired unacknowledged",
            ["channel", "group"],
            registry=r,
        )
        self.dead_lettered = Counter(
            f"{PREFIX}_dead_lettered", "Messages moved to a dead-letter channel", ["channel", "group"], registry=r
        )
        self.member_changes = Counter(
            f"{PREFIX}_queue_member_changes",
            "Queue members joining and leaving",
            ["channel", "group", "change"],
            registry=r,
        )
        self.ack_latency = Histogram(
            f"{PREFIX}_ack_latency_seconds",
            "Time from a delivery to its acknowledgement",
            ["channel", "group"],
            buckets=ACK_LATENCY_BUCKETS,
            registry=r,
        )
        self.attempts = Histogram(
            f"{PREFIX}_delivery_attempt",
            "Attempt number of each delivery (1 = first)",
            ["channel", "group"],
            buckets=ATTEMPT_BUCKETS,
            registry=r,
        )
        self.commit = Histogram(
            f"{PREFIX}_store_commit_duration_seconds",
            "Duration of one group commit (store append with its fsync)",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        # Children by label values: `.labels()` costs a lock and a tuple build per call.
        self._children: dict[tuple[object, ...], Callable[..., None]] = {}

    def attach(self, running: Running) -> None:
        """Add the scrape-time gauges of a started server."""
        self.registry.register(_StateCollector(running))

    # -- group commit observer -------------------------------------------------------------------

    def on_published(self, channel: str, first_seq: int, count: int, nbytes: int) -> None:
        self._inc(self.published_messages, (channel,), count)
        self._inc(self.published_bytes, (channel,), nbytes)

    def on_commit(self, seconds: float, messages: int) -> None:
        self.commit.observe(seconds)

    # -- engine observer -------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if type(event) is Delivered:
            labels = (event.sub.channel, event.sub.group)
            self._inc(self.deliveries, (*labels, event.reason.value), 1)
            self._observe(self.attempts, labels, event.attempt)
        elif type(event) is Acked:
            labels = (event.sub.channel, event.sub.group)
            self._inc(self.acks, labels, 1)
            self._observe(self.ack_latency, labels, event.pending_s)
        elif type(event) is AckTimedOut:
            self._inc(self.ack_timeouts, (event.sub.channel, event.sub.group), 1)
        elif type(event) is DeadLettered:
            self._inc(self.dead_lettered, (event.sub.channel, event.sub.group), 1)
        elif type(event) is MemberJoined:
            self._inc(self.member_changes, (event.sub.channel, event.sub.queue_group, "join"), 1)
        elif type(event) is MemberLeft:
            self._inc(self.member_changes, (event.sub.channel, event.sub.queue_group, "leave"), 1)

    def _inc(self, counter: Counter, labels: tuple[str, ...], amount: float) -> None:
        key = (id(counter), *labels)
        inc = self._children.get(key)
        if inc is None:
            inc = self._children[key] = counter.labels(*labels).inc
        inc(amount)

    def _observe(self, histogram: Histogram, labels: tuple[str, ...], value: float) -> None:
        key = (id(histogram), *labels)
        observe = self._children.get(key)
        if observe is None:
            observe = self._children[key] = histogram.labels(*labels).observe
        observe(value)


class _StateCollector(Collector):
    """Gauges (and the broker's and STAN layer's own counters) read from the running server."""

    def __init__(self, running: Running) -> None:
        self.running = running

    def collect(self) -> Iterator[Metric]:
        running = self.running
        stan, store, broker = running.stan, running.store, running.broker
        yield GaugeMetricFamily(f"{PREFIX}_clients", "Registered STAN clients", value=len(stan.clients.records()))

        views = running.core.engine.views() if running.core.ready.is_set() else []
        subs = GaugeMetricFamily(f"{PREFIX}_subscriptions", "Subscriptions", labels=["state"])
        online = sum(1 for v in views if v.online)
        subs.add_metric(["online"], online)
        subs.add_metric(["offline"], len(views) - online)
        yield subs

        pending = GaugeMetricFamily(
            f"{PREFIX}_ack_pending_messages", "Messages sent and not yet acknowledged", labels=["channel", "group"]
        )
        ack_wait = GaugeMetricFamily(
            f"{PREFIX}_ack_wait_seconds", "Largest AckWait of the subscriptions", labels=["channel", "group"]
        )
        stalled = GaugeMetricFamily(
            f"{PREFIX}_stalled_subscriptions", "Subscriptions at their MaxInflight", labels=["channel", "group"]
        )
        by_group: dict[tuple[str, str], list[float]] = {}  # -> [pending, ack wait, stalled]
        for v in views:
            key = (v.record.channel, v.record.queue_group or v.record.durable_name)
            entry = by_group.setdefault(key, [0, 0, 0])
            entry[0] += v.pending_count
            entry[1] = max(entry[1], v.record.ack_wait_ms / 1000)
            entry[2] += v.stalled and v.online
        for key, (count, wait, stall) in by_group.items():
            pending.add_metric(list(key), count)
            ack_wait.add_metric(list(key), wait)
            stalled.add_metric(list(key), stall)
        yield pending
        yield ack_wait
        yield stalled

        channels = store.channels()
        yield GaugeMetricFamily(f"{PREFIX}_channels", "Channels", value=len(channels))
        msgs = GaugeMetricFamily(f"{PREFIX}_channel_messages", "Messages stored", labels=["channel"])
        size = GaugeMetricFamily(f"{PREFIX}_channel_bytes", "Bytes stored", labels=["channel"])
        last = GaugeMetricFamily(f"{PREFIX}_channel_last_sequence", "Last sequence stored", labels=["channel"])
        for info in channels:
            msgs.add_metric([info.name], info.msgs)
            size.add_metric([info.name], info.bytes)
            last.add_metric([info.name], info.last_seq)
        yield msgs
        yield size
        yield last

        stats = store.statistics()
        used = GaugeMetricFamily(f"{PREFIX}_store_used_bytes", "Bytes used in the store's files", labels=["env"])
        mapped = GaugeMetricFamily(
            f"{PREFIX}_store_map_size_bytes", "Memory map size of the store's files (0: no map)", labels=["env"]
        )
        used.add_metric(["messages"], stats.messages_used_bytes)
        used.add_metric(["state"], stats.state_used_bytes)
        mapped.add_metric(["messages"], stats.messages_map_size_bytes)
        mapped.add_metric(["state"], stats.state_map_size_bytes)
        yield used
        yield mapped
        writable = GaugeMetricFamily(
            f"{PREFIX}_store_writable", "1 while the store takes writes, 0 while it refuses them (a full disk)"
        )
        writable.add_metric([], 0 if running.core.store_write_error() is not None else 1)
        yield writable
        damaged = GaugeMetricFamily(
            f"{PREFIX}_store_damaged_messages", "Stored messages found failing their checksum when read (skipped)"
        )
        damaged.add_metric([], stats.damaged_messages)
        yield damaged

        yield CounterMetricFamily(
            f"{PREFIX}_slow_consumer_disconnects",
            "NATS connections cut off for not reading",
            value=broker.slow_consumers,
        )
        errors = CounterMetricFamily(
            f"{PREFIX}_protocol_errors", "Protocol errors and refused STAN requests", labels=["kind"]
        )
        for kind in PROTOCOL_ERROR_KINDS:
            errors.add_metric([kind], broker.protocol_errors[kind])
        for kind in REFUSAL_KINDS:
            errors.add_metric([kind], stan.refused[kind])
        yield errors
        connections = GaugeMetricFamily(f"{PREFIX}_connections", "Open NATS connections")
        connections.add_metric([], broker.statistics().connections)
        yield connections
