"""A member of a fault-tolerance group, from start to stop: standby, takeover, active, and back.

- **Standby**: its LMDB store follows the group's log (`streaming.ft.replay`), flushed every
  `sync_interval` with the position it holds; it watches the lease. It serves no client.
- **Takeover**: when the lease has not been renewed for `ft_lease` seconds (measured on this member's
  own clock from when it first saw that revision), it sets the lease to itself with the next epoch
  (compare-and-set: one member wins), reads the log to its end, and appends an `Epoch` record that
  expects that end: from then on the old active's appends are refused (fencing). If another record
  came first, it reads on and tries again.
- **Active**: the server runs as a single server would, on a `ReplicatedStore` (every change goes to
  the log before the local store, and a publish is acknowledged only after the log holds it), while
  the lease is renewed every quarter of `ft_lease`. When another member holds the lease, or the log
  refuses a record (fenced) or takes none for four leases, it stops serving at once and starts over
  as a standby. A renewal that fails because JetStream is electing a leader is not a reason: nobody
  else can take the lease meanwhile, and the log's fencing keeps it safe either way.

A member that restarts, or whose data directory was wiped, is a standby that replays from where its
store is (from the log's start when empty); one whose copy is damaged or diverged keeps it aside
and does the same.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import trio

from storage import DamagedStoreError, Store, open_store
from streaming.config import ServerConfig
from streaming.ft import oplog
from streaming.ft.jetstream import Connection, GroupLog, Lease, LogUnavailable
from streaming.ft.lease import LeaseClock, LeaseWatch
from streaming.ft.monitor import standby_app
from streaming.ft.position import Position
from streaming.ft.replay import DivergedError, replay_at
from streaming.ft.status import ACTIVE, STANDBY, FtStatus, GroupError
from streaming.ft.store import NotActiveError, ReplicatedStore
from streaming.http_listener import serve_asgi
from streaming.running import Running
from streaming.server import link_options, serve

log = logging.getLogger(__name__)
_READ_BATCH = 512
# How long, in leases, the active retries a log append before it gives up and stands down: a stream
# whose leader was lost elects another within a few seconds. Safety never depends on it (an append
# that would follow another member's is refused by the stream), only how soon a cut-off active stops.
_APPEND_PATIENCE_LEASES = 4


class ActiveLog:
    """The log as the active writes it (`streaming.ft.store.LogWriter`): each record expects the one
    before it, and is retried under the same id for `patience` seconds (a stream leader being
    elected takes a few)."""

    def __init__(self, group_log: GroupLog, member: str, epoch: int, last: int, patience: float) -> None:
        self._log = group_log
        self._member = member
        self._epoch = epoch
        self._last = last
        self._patience = patience

    @property
    def max_record(self) -> int:
        return self._log.max_record

    def append(self, record: bytes) -> int:
        seq = self._log.append(
            record,
            expected_last=self._last,
            msg_id=f"{self._member}:{self._epoch}:{self._last + 1}",
            within=self._patience,
        )
        self._last = seq
        return seq


def limits_digest(config: ServerConfig) -> str:
    """What members must agree on to number messages alike: their channel limits."""
    limits = config.store_limits()
    return hashlib.sha256(repr(limits).encode()).hexdigest()[:16]


def connection(config: ServerConfig) -> Connection:
    """How the group's log logs in to the cluster: as the server's link does (nats-py reads the nkey
    and credentials files itself)."""
    return Connection(
        [url.strip() for url in config.nats_server.split(",") if url.strip()],
        name=f"{config.server_name} ft {config.ft_group}",
        user=config.nats_user,
        password=config.nats_password,
        token=config.nats_token,
        tls=link_options(config).tls,
        creds=config.nats_creds,
        nkey_seed=config.nats_nkey_seed,
    )


class Member:
    """This server as a member of its group: its status, its lease, its life (`run`)."""

    def __init__(self, config: ServerConfig, group_log: GroupLog) -> None:
        self.config = config
        self.log = group_log
        self.status = FtStatus(config.ft_group, f"{config.server_name}-{secrets.token_hex(4)}")
        self.lease = LeaseClock(float(config.ft_lease))
        self.digest = limits_digest(config)
        self.running: Running | None = None
        self._revision = 0  # the lease's revision this member last wrote

    # -- the whole life --------------------------------------------------------------------------

    async def run(
        self,
        *,
        after_recovery: Callable[[], None] | None = None,
        on_active: Callable[[Running], None] = lambda running: None,
    ) -> None:
        """Standby, takeover, active, and again, until cancelled."""
        config = self.config
        while True:
            store, position = await trio.to_thread.run_sync(self._open_local)
            diverged: list[BaseException] = []
            try:
                try:
                    async with trio.open_nursery() as nursery:
                        if config.http_port:
                            nursery.start_soon(self._serve_standby_monitor)
                        while True:
                            await self._standby(store, position)
                            lost = trio.Event()
                            holding = trio.CancelScope()
                            nursery.start_soon(self._hold_lease, lost, holding)
                            if await self._take_over(store, position, lost):
                                break
                            holding.cancel()
                            log.warning("ft group %s: the takeover did not finish: a standby again", config.ft_group)
                        nursery.cancel_scope.cancel()
                except* DivergedError as group:
                    diverged += group.exceptions
            except BaseException:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(store.close)
                raise
            if diverged:
                await trio.to_thread.run_sync(store.close)
                await trio.to_thread.run_sync(self._move_aside, diverged[0])
                continue
            await self._active(store, position, after_recovery, on_active)
            after_recovery = None  # process-wide settings: once
            self.status.state = STANDBY
            self.running = None
            log.warning("ft group %s: %s stopped serving; it is a standby again", config.ft_group, self.status.member)

    def _open_local(self) -> tuple[Store, Position]:
        """This member's copy, as its data directory holds it; a damaged copy is moved aside (never
        deleted: it may be wanted for a post-mortem) and the member starts from an empty one, which
        it fills from the log."""
        config = self.config
        try:
            return self._open_copy()
        except (DamagedStoreError, GroupError) as exc:
            if isinstance(exc, GroupError) and not Position.damaged(Path(config.dir)):
                raise
            self._move_aside(exc)
            return self._open_copy()

    def _move_aside(self, why: BaseException) -> None:
        """Keep a damaged or diverged copy under another name, and say so; the member starts empty."""
        config = self.config
        aside = Path(f"{config.dir}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        Path(config.dir).rename(aside)
        log.error(
            "ft group %s: this member's copy in %s cannot be used (%s): moved to %s; rebuilding it from the log",
            config.ft_group,
            config.dir,
            why,
            aside,
        )

    def _open_copy(self) -> tuple[Store, Position]:
        config = self.config
        store = open_store(
            "lmdb",
            config.dir,
            config.cluster_id,
            config.store_limits(),
            sync=False,  # the log is the durable copy; the local one is flushed with its position
            # A member's damaged copy is rebuilt from the log, so it must be known before the copy
            # serves: a member checks in full where a lone server would check in the background.
            verify="full" if config.verify_on_start == "background" else config.verify_on_start,
        )
        try:
            position = Position.load(Path(config.dir))
        except GroupError:
            store.close()
            raise
        if not position.log_id and store.channels():
            store.close()
            raise GroupError(
                f"{config.dir} holds channels that did not come from the group's log: start a member of "
                "a group with an empty data directory (it is filled from the log)"
            )
        return store, position

    # -- standby ---------------------------------------------------------------------------------

    async def _standby(self, store: Store, position: Position) -> None:
        """Follow the log until this member holds the lease (its revision in `_revision`)."""
        status, ttl = self.status, self.lease.ttl
        status.state, status.applied = STANDBY, position.applied
        watch = LeaseWatch(ttl)
        next_sync = time.monotonic() + float(self.config.sync_interval)
        log.info("ft group %s: %s is a standby (log position %d)", status.group, status.member, position.applied)
        while True:
            try:
                lease = await trio.to_thread.run_sync(self.log.lease)
            except LogUnavailable as exc:
                log.warning("ft group %s: cannot read the lease: %s", status.group, exc)
                watch.forget()  # the holder cannot renew meanwhile: count a whole lease after this
            else:
                if lease is not None:
                    status.active_member, status.epoch = lease.member, lease.epoch
                if watch.lapsed(None if lease is None else lease.revision) and await self._claim(lease):
                    return
            await self._follow(store, position, wait=ttl / 8)
            if time.monotonic() >= next_sync:
                await trio.to_thread.run_sync(self._flush, store, position)
                next_sync = time.monotonic() + float(self.config.sync_interval)

    async def _claim(self, lease: Lease | None) -> bool:
        """Take the lease that nobody holds or whose holder let it lapse; False when another member
        changed it first."""
        status = self.status
        epoch = 1 if lease is None else lease.epoch + 1
        sent = time.monotonic()
        try:
            revision = await trio.to_thread.run_sync(
                self.log.claim, status.member, epoch, None if lease is None else lease.revision
            )
        except LogUnavailable as exc:
            log.warning("ft group %s: cannot take the lease: %s", status.group, exc)
            return False
        if revision is None:
            return False
        self._revision = revision
        self.lease.renewed(sent)
        status.epoch, status.active_member = epoch, status.member
        held_by = "nobody" if lease is None else f"{lease.member} (epoch {lease.epoch})"
        log.warning("ft group %s: %s takes over from %s as epoch %d", status.group, status.member, held_by, epoch)
        return True

    async def _follow(self, store: Store, position: Position, *, wait: float) -> None:
        """Replay what the log has past this member's position (waiting up to `wait` for some)."""
        records, last = await trio.to_thread.run_sync(self.log.read, position.applied + 1, _READ_BATCH, wait)
        if records:
            await trio.to_thread.run_sync(self._replay, store, position, records)
        if last is not None:
            self.status.log_last = max(last, position.applied)
        self.status.applied = position.applied

    def _replay(self, store: Store, position: Position, records: list[tuple[int, bytes]]) -> None:
        for seq, raw in records:
            record = oplog.decode(raw)
            if isinstance(record, oplog.Genesis):
                if position.log_id and position.log_id != record.log_id:
                    raise GroupError(
                        f"{self.config.dir} was made from another log of group {self.config.ft_group} "
                        f"({position.log_id}, the log is {record.log_id}): empty it to rebuild it from the log"
                    )
                position.log_id = record.log_id
            elif isinstance(record, oplog.Epoch) and record.limits_digest != self.digest:
                log.error(
                    "ft group %s: member %s has other channel limits than this one: give every member the same",
                    self.config.ft_group,
                    record.member,
                )
            replay_at(store, position, seq, record)

    @staticmethod
    def _flush(store: Store, position: Position) -> None:
        store.sync()
        position.save(position.applied)

    # -- takeover --------------------------------------------------------------------------------

    async def _take_over(self, store: Store, position: Position, lost: trio.Event) -> bool:
        """Read the log to its end and append this epoch's record expecting that end (fencing); False
        when the lease was lost meanwhile."""
        status = self.status
        while not lost.is_set() and self.lease.left() > 0:
            try:
                last = await trio.to_thread.run_sync(self.log.last_seq)
            except LogUnavailable as exc:
                log.warning("ft group %s: taking over: %s", status.group, exc)
                await trio.sleep(0.1)
                continue
            while position.applied < last and not lost.is_set():
                await self._follow(store, position, wait=0.5)
            if position.applied == 0:
                genesis = oplog.Genesis(secrets.token_hex(8))
                try:
                    await self._append(oplog.encode(genesis), 0, f"genesis:{genesis.log_id}")
                except NotActiveError:
                    continue
                position.log_id = genesis.log_id
                position.applied = 1
            record = oplog.encode(oplog.Epoch(status.member, status.epoch, self.digest))
            try:
                seq = await self._append(record, position.applied, f"{status.member}:{status.epoch}:epoch")
            except NotActiveError:
                log.info("ft group %s: the log moved on during the takeover: reading on", status.group)
                continue
            position.applied = seq
            await trio.to_thread.run_sync(self._flush, store, position)
            return True
        return False

    async def _append(self, record: bytes, expected_last: int, msg_id: str) -> int:
        within = max(self.lease.left(), 0.5)
        return await trio.to_thread.run_sync(
            partial(self.log.append, record, expected_last=expected_last, msg_id=msg_id, within=within)
        )

    # -- active ----------------------------------------------------------------------------------

    async def _active(
        self,
        store: Store,
        position: Position,
        after_recovery: Callable[[], None] | None,
        on_active: Callable[[Running], None],
    ) -> None:
        status = self.status
        lost = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def on_lost(exc: NotActiveError) -> None:
            log.error("ft group %s: %s", status.group, exc)
            token.run_sync_soon(lost.set)

        patience = _APPEND_PATIENCE_LEASES * self.lease.ttl
        writer = ActiveLog(self.log, status.member, status.epoch, position.applied, patience)
        replicated = ReplicatedStore(store, writer, position, on_lost=on_lost)
        status.takeovers += 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._hold_lease, lost, trio.CancelScope())
            running = await nursery.start(partial(serve, self.config, store=replicated, after_recovery=after_recovery))
            running.ft = status
            status.state = ACTIVE
            status.applied = status.log_last = position.applied
            self.running = running
            if running.event_log is not None:
                running.event_log.on_takeover(status.group, status.member)
            on_active(running)
            await lost.wait()
            nursery.cancel_scope.cancel()

    async def _hold_lease(self, lost: trio.Event, scope: trio.CancelScope) -> None:
        """Renew the lease every quarter of it until it is lost (then set `lost`) or `scope` is cancelled."""
        status, ttl = self.status, self.lease.ttl
        with scope:
            while True:
                await trio.sleep(ttl / 4)
                sent = time.monotonic()
                try:
                    renewed = await trio.to_thread.run_sync(
                        partial(self.log.claim, status.member, status.epoch, self._revision, timeout=ttl / 2)
                    )
                except LogUnavailable as exc:
                    log.warning("ft group %s: could not renew the lease: %s", status.group, exc)
                else:
                    if renewed is None:
                        log.error("ft group %s: another member holds the lease", status.group)
                        lost.set()
                        return
                    self._revision = renewed
                    self.lease.renewed(sent)
                status.applied = status.log_last = self._applied()

    def _applied(self) -> int:
        running = self.running
        if running is not None and isinstance(running.store, ReplicatedStore):
            return running.store.position.applied
        return self.status.applied

    # -- a standby's monitoring page ----------------------------------------------------------------

    async def _serve_standby_monitor(self) -> None:
        config = self.config
        app = standby_app(config.cluster_id, config.server_name, self.status)
        host = config.http_host or config.host
        await serve_asgi(app, host, max(config.http_port, 0), log_name="streaming.ft.monitor.http")


async def serve_member(
    config: ServerConfig,
    *,
    after_recovery: Callable[[], None] | None = None,
    on_active: Callable[[Running], None] = lambda running: None,
    task_status: trio.TaskStatus[Member] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run this server as a member of its FT group until cancelled."""
    group_log = GroupLog(connection(config), config.cluster_id, config.ft_group, config.ft_replicas)
    await trio.to_thread.run_sync(group_log.start)
    try:
        member = Member(config, group_log)
        task_status.started(member)
        await member.run(after_recovery=after_recovery, on_active=on_active)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(group_log.close)
