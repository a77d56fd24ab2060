"""Writing what was read of a nats-streaming-server store into a new data directory of ours.

The store is built in a hidden directory beside the target (`.NAME.importing-PID`) and renamed to it
only once it is whole: an import that fails leaves nothing, and one that is killed leaves only that
hidden directory, never half a data directory. Messages
keep their sequences and timestamps (`LmdbStore.load_channel`), clients their registrations, and
subscriptions their positions and pending sequences, so the server started on the result recovers
them as it would after its own restart: every pending message is redelivered (flagged) before any new
one, to the durable or group that had it.

What the server would not bring back is left out, each with a line saying so: plain subscriptions of
clients that are no longer registered, and pending sequences whose messages are gone (below the
channel's first sequence: nats-streaming-server acknowledges those itself when it comes to them).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

from storage import (
    ClientRecord,
    LmdbStore,
    Message,
    SaveClient,
    SaveSubscription,
    SetPendingRun,
    StoreLimits,
    SubscriptionRecord,
    SubUpdate,
)
from streaming.stan_import.limits import Retention
from streaming.stan_import.model import Progress, RefusedError, StanChannel, StanStore, StanSubscription


@attrs.frozen
class ImportOptions:
    dry_run: bool = False
    messages_only: bool = False  # a clustered node's store: its messages, without clients or subscriptions
    retention: Retention | None = None  # the limits of the STAN config file, applied as it would at start
    ours: StoreLimits = attrs.field(factory=StoreLimits)  # the server's limits (channels they would trim are named)


@attrs.define
class Report:
    lines: list[str] = attrs.Factory(list)
    channels: int = 0
    messages: int = 0
    clients: int = 0
    subscriptions: int = 0
    seconds: float = 0.0


def check_importable(store: StanStore, options: ImportOptions) -> None:
    """Refuse what cannot be imported as asked, before anything is written."""
    if store.server.NodeID and not options.messages_only:
        raise RefusedError(
            f"this is the store of clustered node {store.server.NodeID!r}: a clustered nats-streaming-server "
            "keeps its clients, subscriptions and acknowledgements in its Raft log, not in this store, so "
            "importing it would lose every durable's position; import the store of a standalone server, or "
            "add --messages_only to import the messages alone"
        )
    seen: dict[str, str] = {}
    for channel in store.channels:
        other = seen.setdefault(channel.name.lower(), channel.name)
        if other != channel.name:
            raise RefusedError(
                f"channels {other!r} and {channel.name!r} differ only in case, which this server does not allow; "
                "rename one of the directories in a copy of the store"
            )


def import_store(store: StanStore, target: Path, options: ImportOptions, progress: Progress | None = None) -> Report:
    """Write `store` into the new data directory `target` (nothing when `dry_run`: read and report)."""
    check_importable(store, options)
    started = time.monotonic()
    if not options.dry_run and target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise RefusedError(f"{target} exists and is not empty: import into a new data directory")
    building = target.parent / f".{target.name}.importing-{os.getpid()}"
    report = Report()
    our: LmdbStore | None = None
    try:
        if not options.dry_run:
            building.mkdir(parents=True)
            # Limits are the server's business when it runs; the import keeps everything it is given.
            our = LmdbStore(building, store.server.ClusterID, StoreLimits(max_channels=0, max_subs=0))
        if not options.messages_only:
            _clients(store, our, report)
        for channel in store.channels:
            _channel(store, channel, our, options, report, progress)
        if our is not None:
            our.close()
            our = None
            if target.exists():
                target.rmdir()
            building.rename(target)
    finally:
        if our is not None:
            our.close()
        if building.exists():
            shutil.rmtree(building)
    report.seconds = time.monotonic() - started
    _advice(store, options, report)
    return report


def _clients(store: StanStore, our: LmdbStore | None, report: Report) -> None:
    updates: list[SubUpdate] = [
        SaveClient(ClientRecord(c.ID, c.HbInbox, c.ConnID, c.Protocol, c.PingInterval, c.PingMaxOut))
        for c in store.clients.values()
    ]
    if our is not None and updates:
        our.apply(updates)
    report.clients = len(updates)


def _channel(
    store: StanStore,
    channel: StanChannel,
    our: LmdbStore | None,
    options: ImportOptions,
    report: Report,
    progress: Progress | None,
) -> None:
    kept, why = _kept(channel, options, progress)
    if our is not None:
        info = our.load_channel(channel.name, kept, last_seq=channel.last_seq)
        first, count = info.first_seq, info.msgs
    else:
        count = 0
        first = 0
        for m in kept:
            first, count = first or m.seq, count + 1
        first = first or channel.last_seq + 1
    report.channels += 1
    report.messages += count
    if count < channel.msgs and why:
        report.lines.append(f"channel {channel.name!r}: the oldest {channel.msgs - count} messages left out: {why}")
    report.lines.append(
        f"channel {channel.name!r}: {count} messages"
        + (f", sequences {first}..{channel.last_seq}" if count else f", none left (last sequence {channel.last_seq})")
    )
    if not options.messages_only:
        _subscriptions(store, channel, first, our, report)


def _kept(channel: StanChannel, options: ImportOptions, progress: Progress | None) -> tuple[Iterator[Message], str]:
    """The channel's messages that the STAN config's limits keep (all of them without one), and
    which limits remove some."""
    if options.retention is None:
        return channel.messages(progress), ""
    cut = options.retention.cut(channel)
    return cut.apply(channel.messages(progress)), cut.why


def _subscriptions(store: StanStore, channel: StanChannel, first: int, our: LmdbStore | None, report: Report) -> None:
    updates: list[SubUpdate] = []
    for sub in channel.subscriptions:
        state = sub.state
        if not sub.is_durable and state.clientID not in store.clients:
            report.lines.append(
                f"channel {channel.name!r}: left out the plain subscription of client {state.clientID!r}, which is "
                "not registered (the server would not bring it back either)"
            )
            continue
        gone = sorted(seq for seq in sub.pending if seq < first)
        if gone:
            report.lines.append(
                f"channel {channel.name!r}: {_describe(sub)} had {len(gone)} pending messages that are gone "
                f"({gone[0]}..{gone[-1]}, below the first sequence {first}): not imported"
            )
        pending = sorted(seq for seq in sub.pending if seq >= first)
        sub_id = our.new_subscription_id() if our is not None else state.ID
        record = SubscriptionRecord(
            sub_id=sub_id,
            channel=channel.name,
            client_id=state.clientID,
            inbox=state.inbox,
            ack_inbox=state.ackInbox,
            ack_wait_ms=max(1, state.ackWaitInSecs) * 1000,
            max_inflight=max(1, state.maxInFlight),
            durable_name=sub.durable_name,
            queue_group=sub.queue_group,
            last_sent=state.lastSent,
            is_durable=sub.is_durable,
            is_closed=state.isClosed,
        )
        updates.append(SaveSubscription(record))
        if pending:
            updates.append(SetPendingRun(sub_id, pending))
        report.subscriptions += 1
    if our is not None and updates:
        our.apply(updates)


def _describe(sub: StanSubscription) -> str:
    state = sub.state
    if sub.queue_group:
        if not state.clientID:
            return f"durable queue group {sub.queue_group!r} (no member connected)"
        return f"member {state.clientID!r} of queue group {sub.queue_group!r}"
    if sub.is_durable:
        return f"durable {sub.durable_name!r} of client {state.clientID!r}"
    return f"subscription of client {state.clientID!r}"


def _advice(store: StanStore, options: ImportOptions, report: Report) -> None:
    """What the user should know before starting the server on the result."""
    for channel in store.channels:
        limits = options.ours.for_channel(channel.name)
        over = []
        if limits.max_msgs and channel.msgs > limits.max_msgs:
            over.append(f"{channel.msgs} messages, over max_msgs {limits.max_msgs}")
        if limits.max_bytes and channel.bytes > limits.max_bytes:
            over.append(f"about {channel.bytes} bytes, over max_bytes {limits.max_bytes}")
        if limits.max_age_s and channel.msgs:
            over.append(f"messages older than max_age {limits.max_age_s:g} s will go")
        if over and options.retention is None:
            report.lines.append(
                f"channel {channel.name!r}: {'; '.join(over)}: the server's limits will trim it when it runs "
                "(set [limits] or [channels] in its config to keep more)"
            )
    expected = f"_STAN.pub.{store.server.ClusterID}"
    if store.server.Publish and store.server.Publish != expected:
        report.lines.append(
            f"the old server took publishes on {store.server.Publish!r} (this one on {expected!r}): connected "
            "clients must reconnect before they publish again"
        )
