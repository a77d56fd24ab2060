"""Prometheus metrics of one server: counters and histograms fed by the engine's and the group commit's
observer interfaces, and gauges read from the server's state at scrape time.

Names carry one prefix (`streaming_`), base units, and `_total` on counters. Labels are only `channel`
and `group` (queue group, else durable name, else empty), plus fixed sets (`reason`, `kind`, `env`):
all bounded by the server's limits. Client ids, inboxes and sequences go to the event log instead.
"""

from __future__ import annotations

import platform
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from importlib import metadata
from operator import itemgetter

from prometheus_client import CollectorRegistry, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from streaming.bayeux.door import BayeuxStatistics
from streaming.core.engine import (
    Acked,
    AckedRun,
    AckTimedOut,
    DeadLettered,
    Delivered,
    DeliveredRun,
    Event,
    MemberJoined,
    MemberLeft,
    Naked,
    Reason,
)
from streaming.ft.status import ACTIVE, FtStatus
from streaming.nats.broker import PROTOCOL_ERROR_KINDS
from streaming.pull.door import PullStatistics
from streaming.running import Running
from streaming.stan.door import REFUSAL_KINDS

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


_DELIVERED_AT = itemgetter(1)  # of an `AckedRun.acked` entry: the clock time of the delivery acked


class _Counts:
    """A counter family kept as plain numbers by label values, turned into Prometheus's form only when
    scraped: an update is a dict operation, not prometheus_client's lock and child lookup."""

    __slots__ = ("doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def add(self, key: tuple[str, ...], amount: float = 1) -> None:
        values = self.values
        values[key] = values.get(key, 0) + amount

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in list(self.values.items()):
            family.add_metric(list(key), value)
        return family


class _Buckets:
    """A histogram family kept as plain bucket counts by label values (see `_Counts`)."""

    __slots__ = ("bounds", "doc", "labels", "name", "rows")

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]) -> None:
        self.name, self.doc, self.labels, self.bounds = name, doc, list(labels), list(bounds)
        self.rows: dict[tuple[str, ...], list[float]] = {}  # per bucket (le), then +Inf, then the sum

    def observe(self, key: tuple[str, ...], value: float, times: int = 1) -> None:
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0.0] * (len(self.bounds) + 2)
        row[bisect_left(self.bounds, value)] += times
        row[-1] += value * times

    def observe_since(self, key: tuple[str, ...], now: float, started: Iterable[float]) -> None:
        """`observe(now - s)` for each clock time `s` in `started` (a negative `s`: observe 0), counted
        in C: the times are sorted once, and a value is at most a bound `b` exactly when its start is
        at or after `now - b`, so each bucket is a difference of two bisections, not a step per value."""
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0.0] * (len(self.bounds) + 2)
        times = sorted(started)
        n = len(times)
        unset = bisect_left(times, 0.0)  # no delivery was pending: observed as 0
        below = 0  # values <= the previous bound
        for i, bound in enumerate(self.bounds):
            if below == n:  # all counted: the larger bounds get none
                break
            at_most = n - bisect_left(times, now - bound, unset) + unset
            row[i] += at_most - below
            below = at_most
        row[-2] += n - below
        row[-1] += (n - unset) * now - (sum(times[unset:]) if unset else sum(times))

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, row in list(self.rows.items()):
            buckets, total = [], 0.0
            for bound, count in zip([*map(floatToGoString, self.bounds), "+Inf"], row[:-1], strict=True):
                total += count
                buckets.append((bound, total))
            family.add_metric(list(key), buckets, row[-1])
        return family


class Metrics:
    """Owns a registry (one per server, so several servers in one test process do not clash)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Info(f"{PREFIX}_build", "Version of the server", registry=r).info(
            {"version": version(), "python": platform.python_version()}
        )
        ProcessCollector(registry=r)
        self.published_messages = _Counts(f"{PREFIX}_published_messages", "Messages stored by publishes", ["channel"])
        self.published_bytes = _Counts(f"{PREFIX}_published_bytes", "Payload bytes stored by publishes", ["channel"])
        self.deliveries = _Counts(
            f"{PREFIX}_deliveries",
            "Messages sent to subscribers, by why they were sent",
            ["channel", "group", "reason"],
        )
        self.acks = _Counts(f"{PREFIX}_acks", "Acknowledgements applied", ["channel", "group"])
        self.ack_timeouts = _Counts(
            f"{PREFIX}_ack_timeouts", "Deliveries whose AckWait expired unacknowledged", ["channel", "group"]
        )
        self.naks = _Counts(
            f"{PREFIX}_naks", "Messages given back by their subscriber with a negative ack", ["channel", "group"]
        )
        self.dead_lettered = _Counts(
            f"{PREFIX}_dead_lettered", "Messages moved to a dead-letter channel", ["channel", "group"]
        )
        self.member_changes = _Counts(
            f"{PREFIX}_queue_member_changes", "Queue members joining and leaving", ["channel", "group", "change"]
        )
        self.ack_latency = _Buckets(
            f"{PREFIX}_ack_latency_seconds",
            "Time from a delivery to its acknowledgement",
            ["channel", "group"],
            ACK_LATENCY_BUCKETS,
        )
        self.attempts = _Buckets(
            f"{PREFIX}_delivery_attempt",
            "Attempt number of each delivery (1 = first)",
            ["channel", "group"],
            ATTEMPT_BUCKETS,
        )
        self.commit = _Buckets(
            f"{PREFIX}_store_commit_duration_seconds",
            "Duration of one group commit (store append with its fsync)",
            [],
            COMMIT_BUCKETS,
        )
        self._families: list[_Counts | _Buckets] = [
            self.published_messages,
            self.published_bytes,
            self.deliveries,
            self.acks,
            self.ack_timeouts,
            self.dead_lettered,
            self.member_changes,
            self.ack_latency,
            self.attempts,
            self.commit,
        ]
        r.register(_Tallies(self._families))
        self._delivery_keys: dict[tuple[tuple[str, str], Reason], tuple[str, ...]] = {}  # bounded like the labels

    def attach(self, running: Running) -> None:
        """Add the scrape-time gauges of a started server."""
        self.registry.register(_StateCollector(running))

    # -- group commit observer -------------------------------------------------------------------

    def on_published(self, channel: str, first_seq: int, count: int, nbytes: int) -> None:
        key = (channel,)
        self.published_messages.add(key, count)
        self.published_bytes.add(key, nbytes)

    def on_commit(self, seconds: float, messages: int) -> None:
        self.commit.observe((), seconds)

    # -- engine observer (a pass's events; a run of deliveries or acks counts in one step) ---------

    def on_events(self, events: Sequence[Event]) -> None:
        for event in events:
            if type(event) is DeliveredRun:
                labels = event.sub.labels
                count = len(event.seqs)
                self.deliveries.add(self._delivery_key(labels, Reason.NEW), count)
                self.attempts.observe(labels, 1, count)
            elif type(event) is AckedRun:
                labels = event.sub.labels
                self.acks.add(labels, len(event.seqs))
                self.ack_latency.observe_since(labels, event.at, map(_DELIVERED_AT, event.acked))
            elif type(event) is Delivered:
                labels = event.sub.labels
                self.deliveries.add(self._delivery_key(labels, event.reason))
                self.attempts.observe(labels, event.attempt)
            elif type(event) is Acked:
                labels = event.sub.labels
                self.acks.add(labels)
                self.ack_latency.observe(labels, event.pending_s)
            elif type(event) is AckTimedOut:
                self.ack_timeouts.add(event.sub.labels)
            elif type(event) is DeadLettered:
                self.dead_lettered.add(event.sub.labels)
            elif type(event) is Naked:
                self.naks.add(event.sub.labels)
            elif type(event) is MemberJoined:
                self.member_changes.add((event.sub.channel, event.sub.queue_group, "join"))
            elif type(event) is MemberLeft:
                self.member_changes.add((event.sub.channel, event.sub.queue_group, "leave"))

    def _delivery_key(self, labels: tuple[str, str], reason: Reason) -> tuple[str, ...]:
        key = self._delivery_keys.get((labels, reason))
        if key is None:
            key = self._delivery_keys[(labels, reason)] = (*labels, reason.value)
        return key


class _Tallies(Collector):
    """The counters and histograms `Metrics` keeps as plain numbers, in Prometheus's form."""

    def __init__(self, families: list[_Counts | _Buckets]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.family()


def ft_metrics(status: FtStatus) -> Iterator[Metric]:
    """Where this server stands in its fault-tolerance group (on the active and on each standby)."""
    labels = [status.group]
    active = GaugeMetricFamily(
        f"{PREFIX}_ft_active", "1 when this member serves its FT group, 0 when it stands by", labels=["ft_group"]
    )
    active.add_metric(labels, 1 if status.state == ACTIVE else 0)
    yield active
    epoch = GaugeMetricFamily(f"{PREFIX}_ft_epoch", "The group's epoch, as this member knows it", labels=["ft_group"])
    epoch.add_metric(labels, status.epoch)
    yield epoch
    lag = GaugeMetricFamily(
        f"{PREFIX}_ft_lag_records", "Records of the group's log this member does not hold yet", labels=["ft_group"]
    )
    lag.add_metric(labels, status.lag)
    yield lag
    takeovers = CounterMetricFamily(
        f"{PREFIX}_ft_takeovers", "Times this member became its FT group's active", labels=["ft_group"]
    )
    takeovers.add_metric(labels, status.takeovers)
    yield takeovers


class _StateCollector(Collector):
    """Gauges (and the broker's and STAN layer's own counters) read from the running server."""

    def __init__(self, running: Running) -> None:
        self.running = running

    def collect(self) -> Iterator[Metric]:
        running = self.running
        stan, store, broker = running.stan, running.store, running.bus
        yield GaugeMetricFamily(f"{PREFIX}_clients", "Registered STAN clients", value=len(stan.clients.records()))
        server = GaugeMetricFamily(
            f"{PREFIX}_server_info",
            "This server: its name, the NATS URL it serves on or is attached to, the channels it owns",
            labels=["server_name", "cluster_id", "nats_url", "channels_owned"],
        )
        owned = ",".join(running.partition.patterns) if running.partition is not None else "*"
        server.add_metric([running.server_name, stan.config.cluster_id, broker.url, owned], 1)
        yield server
        if running.ft is not None:
            yield from ft_metrics(running.ft)

        views = running.api.views()
        subs = GaugeMetricFamily(f"{PREFIX}_subscriptions", "Subscriptions", labels=["state"])
        whole = [v for v in views if not v.record.parent_id]  # a wildcard subscription once, not per channel
        online = sum(1 for v in whole if v.online)
        subs.add_metric(["online"], online)
        subs.add_metric(["offline"], len(whole) - online)
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
            if v.record.is_pattern:
                continue  # counted on its channels, by its parts
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
        writable.add_metric([], 0 if running.api.store_write_error() is not None else 1)
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
        if running.bayeux is not None:
            yield from _bayeux_metrics(running.bayeux.statistics())
        if running.pull is not None:
            yield from _pull_metrics(running.pull.statistics())


def _pull_metrics(stats: PullStatistics) -> Iterator[Metric]:
    """The HTTP pull door's consumers and acks (its deliveries count with every other door's)."""
    yield GaugeMetricFamily(f"{PREFIX}_pull_consumers", "HTTP pull consumers", value=stats.consumers)
    counters = [
        ("consumers_created", "HTTP pull consumers created", stats.created),
        ("consumers_expired", "HTTP pull consumers expired for being idle", stats.expired),
        ("handed_out_messages", "Messages handed out in pull responses", stats.handed_out),
        ("acks", "Acknowledgements that settled a delivery", stats.acked),
        ("nacks", "Negative acknowledgements (the message is handed out again)", stats.nacked),
        ("stale_acks", "Acknowledgements refused with 412 (their delivery was no longer current)", stats.stale_acks),
        ("published_messages", "Messages published over HTTP and stored", stats.published),
    ]
    yield from _counters("pull", counters)


def _bayeux_metrics(stats: BayeuxStatistics) -> Iterator[Metric]:
    """The Bayeux door's sessions and batches (its deliveries and acks count with every other door's)."""
    yield GaugeMetricFamily(f"{PREFIX}_bayeux_sessions", "Bayeux sessions", value=stats.sessions)
    yield GaugeMetricFamily(f"{PREFIX}_bayeux_held_connects", "Held /meta/connect requests", value=stats.held_connects)
    yield GaugeMetricFamily(f"{PREFIX}_bayeux_websockets", "Open Bayeux WebSocket connections", value=stats.websockets)
    yield GaugeMetricFamily(
        f"{PREFIX}_bayeux_queued_messages",
        "Messages in Bayeux sessions' queues: not sent yet, or sent and not acknowledged by batch",
        value=stats.queued_messages,
    )
    counters = [
        ("handshakes", "Bayeux sessions opened", stats.handshakes),
        ("expired_sessions", "Bayeux sessions expired for not connecting", stats.expired_sessions),
        ("batches", "Connect replies that closed an ack batch", stats.batches),
        ("delivered_messages", "Messages written into connect replies (resends included)", stats.delivered_messages),
        ("resent_messages", "Messages written again because their batch was not acknowledged", stats.resent_messages),
        ("published_messages", "Messages published through the Bayeux door and stored", stats.published_messages),
    ]
    yield from _counters("bayeux", counters)


def _counters(door: str, counters: list[tuple[str, str, int]]) -> Iterator[Metric]:
    """A door's own counters, read from its statistics: (name, help, value) each."""
    for name, text, value in counters:
        yield CounterMetricFamily(f"{PREFIX}_{door}_{name}", text, value=value)
