"""A fault-tolerance group's log and lease in NATS JetStream, through nats-py.

nats-py runs on asyncio; the server runs on Trio and its store calls run on worker threads. So the
client lives on an asyncio loop in a thread of its own, and every call here blocks its caller until
that loop answers: it may be called from any thread (a store call on the store thread; the group's
Trio code through `trio.to_thread`).

- The log: a stream `FT_<cluster>_<group>` (file storage, `replicas` copies, nothing discarded) on the
  subject `_FT.<cluster>.<group>.log`. The active appends with `Nats-Expected-Last-Sequence` (so a
  member that is no longer the active is refused by the stream's leader) and a `Nats-Msg-Id` (so an
  append retried after a lost answer is stored once). Members read it through an ephemeral pull
  consumer from any sequence.
- The lease: a key-value bucket `FT_<cluster>_<group>_lease` (history 1, `replicas` copies) whose key
  `active` holds the active member and its epoch; taken and renewed by compare-and-set on the revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import attrs
import nats
import nats.errors
import nats.js.errors
from nats.js import api

from streaming.ft.status import GroupError
from streaming.ft.store import NotActiveError

T = TypeVar("T")
log = logging.getLogger(__name__)
_WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed Nats-Expected-Last-Sequence
_NO_PEERS_FOR_PLACEMENT = 10005  # JetStream: the cluster knows too few nodes for the replicas (yet)
_KEY = "active"


class LogUnavailable(Exception):
    """JetStream did not answer, or not yet (a node gone, a leader being elected): try again later."""


def _token(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


@attrs.frozen
class Lease:
    member: str
    epoch: int
    revision: int


@attrs.frozen
class Connection:
    servers: list[str]
    name: str = ""
    user: str = ""
    password: str = ""
    token: str = ""
    tls: ssl.SSLContext | None = None
    creds: str = ""  # a credentials file (user JWT and seed)
    nkey_seed: str = ""  # a file holding an nkey seed


class GroupLog:
    def __init__(self, connection: Connection, cluster_id: str, group: str, replicas: int) -> None:
        self.connection = connection
        self.stream = f"FT_{_token(cluster_id)}_{_token(group)}"
        self.subject = f"_FT.{_token(cluster_id)}.{_token(group)}.log"
        self.bucket = f"{self.stream}_lease"
        self.replicas = replicas
        self.max_record = 1024 * 1024
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._nc: Any = None
        self._js: Any = None
        self._kv: Any = None
        self._reader: Any = None
        self._reader_next = 0
        self._last_error = ("", 0.0)

    # -- the loop in its thread -------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Connect, and make the stream and the bucket if they do not exist (blocking)."""
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"ft-{self.stream}", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self._call(self._connect, timeout=timeout)
        except LogUnavailable as exc:
            servers = ", ".join(self.connection.servers)
            raise GroupError(f"cannot reach JetStream through the NATS cluster at {servers}: {exc}") from None

    def _call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        """Run `fn` on the client's loop and wait for it; what went wrong on the way to JetStream (a
        node gone, a leader being elected, no answer in time) comes out as `LogUnavailable`."""
        assert self._loop is not None, "GroupLog.start() first"
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(fn(), timeout), self._loop)
        try:
            return future.result()
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            if isinstance(exc, GroupError | NotActiveError):
                raise
            raise LogUnavailable(f"{type(exc).__name__}: {exc or 'no answer in time'}") from None

    def close(self) -> None:
        if self._loop is None:
            return
        with contextlib.suppress(Exception):  # closing: nothing more to be done with the connection
            self._call(self._close, timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = None

    async def _on_error(self, exc: Exception) -> None:
        text, now = f"{type(exc).__name__}: {exc}", time.monotonic()
        if text != self._last_error[0] or now - self._last_error[1] > 10:  # once a spell, not every retry
            log.warning("ft log %s: %s", self.stream, text)
            self._last_error = (text, now)

    async def _on_disconnected(self) -> None:
        log.warning("ft log %s: lost the connection to the NATS cluster: reconnecting", self.stream)

    async def _on_reconnected(self) -> None:
        url = self._nc.connected_url
        log.info("ft log %s: reconnected to %s", self.stream, url.netloc if url is not None else "the cluster")

    async def _close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    async def _connect(self) -> None:
        c = self.connection
        options: dict[str, Any] = {
            "servers": c.servers,
            "name": c.name or "streaming-server ft",
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.1,
            "connect_timeout": 2,
            "allow_reconnect": True,
            # One line each, not nats-py's tracebacks: a node going away is an event, not a bug here.
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
        }
        if c.user:
            options.update(user=c.user, password=c.password)
        if c.token:
            options["token"] = c.token
        if c.tls is not None:
            options["tls"] = c.tls
        if c.creds:
            options["user_credentials"] = c.creds
        if c.nkey_seed:
            options["nkeys_seed"] = c.nkey_seed
        self._nc = await nats.connect(**options)
        self.max_record = self._nc.max_payload
        self._js = self._nc.jetstream(timeout=2.0)
        # A cluster that just started elects its JetStream leaders for a few seconds: try until then.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15.0
        while True:
            try:
                await self._make()
                return
            except GroupError:
                raise
            except nats.errors.NoRespondersError:
                if loop.time() > deadline:
                    raise GroupError("the NATS cluster has no JetStream (start its nodes with -js)") from None
            except nats.js.errors.ServiceUnavailableError as exc:
                if loop.time() > deadline:
                    raise GroupError(f"JetStream is not available: {exc.description}") from None
            except nats.js.errors.APIError as exc:
                # "No suitable peers for placement": the cluster's meta leader does not know enough of
                # its nodes yet (they are still meeting, on a busy machine for seconds). Else, final.
                if exc.err_code != _NO_PEERS_FOR_PLACEMENT or loop.time() > deadline:
                    raise GroupError(f"stream {self.stream}: {exc.description}") from None
            except nats.errors.TimeoutError:
                if loop.time() > deadline:
                    raise GroupError("JetStream did not answer (too few nodes up for the replicas?)") from None
            await asyncio.sleep(0.25)

    async def _make(self) -> None:
        try:
            info = await self._js.stream_info(self.stream)
            if info.config.num_replicas != self.replicas:
                raise GroupError(
                    f"stream {self.stream} has {info.config.num_replicas} replicas, this server is configured "
                    f"for {self.replicas} (ft_replicas must be the same on every member)"
                )
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(
                api.StreamConfig(
                    name=self.stream,
                    subjects=[self.subject],
                    storage=api.StorageType.FILE,
                    num_replicas=self.replicas,
                    duplicate_window=120.0,
                    max_msgs=-1,
                    max_bytes=-1,
                    max_age=0,
                )
            )
        try:
            self._kv = await self._js.key_value(self.bucket)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await self._js.create_key_value(bucket=self.bucket, history=1, replicas=self.replicas)
        except nats.js.errors.APIError as exc:
            if exc.err_code == _NO_PEERS_FOR_PLACEMENT:
                raise  # the cluster is still forming: tried again
            raise GroupError(f"lease bucket {self.bucket}: {exc.description}") from None

    # -- the log ----------------------------------------------------------------------------------

    def last_seq(self, timeout: float = 5.0) -> int:
        async def last() -> int:
            info = await self._js.stream_info(self.stream)
            return int(info.state.last_seq)

        return self._call(last, timeout)

    def read(self, from_seq: int, max_count: int, wait: float) -> tuple[list[tuple[int, bytes]], int | None]:
        """Up to `max_count` records from `from_seq` on, in order ([] when none came within `wait`), and
        the log's last sequence as the answer showed it (None: unknown)."""

        async def fetch() -> tuple[list[tuple[int, bytes]], int | None]:
            if self._reader is None or self._reader_next != from_seq:
                await self._drop_reader()
                config = api.ConsumerConfig(
                    deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=from_seq,
                    ack_policy=api.AckPolicy.NONE,
                    inactive_threshold=30.0,
                    mem_storage=True,
                    num_replicas=1,
                )
                self._reader = await self._js.pull_subscribe(self.subject, stream=self.stream, config=config)
                self._reader_next = from_seq
            try:
                msgs = await self._reader.fetch(batch=max_count, timeout=wait)
            except nats.errors.TimeoutError:
                # Nothing new, or a consumer that is gone with the node it was on: the stream says which.
                end = int((await self._js.stream_info(self.stream)).state.last_seq)
                if end >= from_seq:
                    await self._drop_reader()
                return [], end
            out: list[tuple[int, bytes]] = []
            last: int | None = None
            for msg in msgs:
                seq = int(msg.metadata.sequence.stream)
                if seq != self._reader_next:  # a consumer lost and remade by the server: start again
                    await self._drop_reader()
                    break
                out.append((seq, bytes(msg.data)))
                self._reader_next = seq + 1
                last = seq + int(msg.metadata.num_pending)  # what the stream holds past this one
            return out, last

        try:
            return self._call(fetch, wait + 5.0)
        except LogUnavailable:
            with contextlib.suppress(LogUnavailable):
                self._call(self._drop_reader, 5.0)
            return [], None

    async def _drop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(nats.errors.Error):
                await reader.unsubscribe()

    def append(self, record: bytes, *, expected_last: int, msg_id: str, within: float) -> int:
        """Append after `expected_last`; the record's sequence. Retried (the same id) until `within`
        seconds have gone; NotActiveError when the log refuses it or never answered."""

        async def publish() -> int:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + within
            headers = {"Nats-Expected-Last-Sequence": str(expected_last), "Nats-Msg-Id": msg_id}
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise NotActiveError(f"the group's log took no record for {within:.1f}s")
                try:
                    ack = await self._js.publish(self.subject, record, timeout=min(left, 1.0), headers=headers)
                    return int(ack.seq)
                except nats.js.errors.APIError as exc:
                    if exc.err_code == _WRONG_LAST_SEQUENCE:
                        raise NotActiveError("another member wrote to the group's log: this one was fenced") from None
                    await asyncio.sleep(0.05)  # no leader for the stream yet: try again, same id
                except (nats.errors.Error, OSError):  # no answer, no node, a reconnect: again, same id
                    await asyncio.sleep(0.05)

        try:
            return self._call(publish, within + 2.0)
        except LogUnavailable as exc:
            raise NotActiveError(f"the group's log took no record for {within:.1f}s ({exc})") from None

    # -- the lease --------------------------------------------------------------------------------

    def lease(self, timeout: float = 2.0) -> Lease | None:
        """Who holds the lease now (None: nobody ever did); raises on a log that does not answer."""

        async def get() -> Lease | None:
            try:
                entry = await self._kv.get(_KEY)
            except nats.js.errors.KeyNotFoundError:
                return None
            data = json.loads(entry.value)
            return Lease(str(data["member"]), int(data["epoch"]), int(entry.revision))

        return self._call(get, timeout)

    def claim(self, member: str, epoch: int, revision: int | None, timeout: float = 2.0) -> int | None:
        """Set the lease to (`member`, `epoch`) if it is still at `revision` (None: never held); its new
        revision, or None when someone else changed it first."""
        value = json.dumps({"member": member, "epoch": epoch}).encode()

        async def cas() -> int | None:
            try:
                if revision is None:
                    return int(await self._kv.create(_KEY, value))
                return int(await self._kv.update(_KEY, value, last=revision))
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyValueError):
                return None
            except nats.js.errors.APIError as exc:
                if exc.err_code == _WRONG_LAST_SEQUENCE:
                    return None
                raise

        return self._call(cas, timeout)
