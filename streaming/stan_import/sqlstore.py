"""Reading a nats-streaming-server SQL store (`-st SQL`, PostgreSQL or MySQL), read-only.

Its tables: ServerInfo (one row: the cluster ID and the ServerInfo protobuf), Clients (ID, heartbeat
inbox, ClientInfo protobuf when the server wrote one), Channels (ID, name, `maxseq`, a `deleted` flag),
Messages (channel ID, sequence, timestamp, size, the whole MsgProto), Subscriptions (channel ID, sub
ID, `lastsent`, SubState protobuf, `deleted`) and SubsPending. A subscription's pending messages are
rows of SubsPending: one row per pending message (`seq` > 0, the server's no-caching mode), or, by
default, one row per flush holding JSON arrays of what was sent (`pending`) and acknowledged (`acks`)
since the row before; an ack cancels a pending message of an earlier row. Its last-sent position is
the highest of the column, its protobuf, every row's `lastsent` and every pending sequence. A channel
whose messages are all gone keeps its last sequence in `maxseq`.

The same checks as the file store's: each message's protobuf must parse and carry its row's sequence,
encrypted data is decrypted per channel, and a store whose payloads all look encrypted is refused
without a key. Messages are read in batches through one cursor per channel, never all at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from storage import Message
from streaming.stan_import.crypto import ChannelDecryptor, DecryptionError, LooksEncrypted
from streaming.stan_import.model import (
    RECORD_OVERHEAD,
    Progress,
    ReadOptions,
    RefusedError,
    StanChannel,
    StanStore,
    StanSubscription,
)
from streaming.stan_import.spb.store_pb2 import ClientInfo, ServerInfo, SubState
from streaming.wire.stan_pb.protocol_pb2 import MsgProto

M = TypeVar("M", bound=ProtoMessage)
DRIVERS = ("postgres", "mysql")
FETCH = 2_000  # messages per round trip
# The Go MySQL driver's DSN: [user[:password]@][protocol[(address)]]/dbname[?params]
_MYSQL_DSN = re.compile(
    r"^(?:(?P<user>[^:@/]*)(?::(?P<password>[^@]*))?@)?(?:\w+\((?P<address>[^)]*)\))?/(?P<db>[^?]*)"
)


class SqlStoreError(RefusedError):
    """The database cannot be read as a nats-streaming-server store."""


class Cursor(Protocol):
    def execute(self, query: str, params: tuple[Any, ...] = ...) -> Any: ...
    def fetchall(self) -> list[tuple[Any, ...]]: ...
    def fetchmany(self, size: int) -> list[tuple[Any, ...]]: ...
    def close(self) -> None: ...


class SqlStoreReader:
    """One nats-streaming-server SQL database; `read()` gives the same StanStore as the file store's
    reader, its channels streaming their messages from the database."""

    def __init__(self, driver: str, source: str, options: ReadOptions) -> None:
        if driver not in DRIVERS:
            raise SqlStoreError(f"--sql_driver must be one of {', '.join(DRIVERS)}, not {driver!r}")
        self.driver, self.options = driver, options
        self._connection = _connect(driver, source)
        self._notes: list[str] = []

    def close(self) -> None:
        self._connection.close()

    def _cursor(self, *, streaming: bool = False) -> Cursor:
        if streaming and self.driver == "postgres":
            import uuid

            return self._connection.cursor(name=f"import_{uuid.uuid4().hex}")  # type: ignore[no-any-return]
        if streaming:
            import pymysql.cursors

            return self._connection.cursor(pymysql.cursors.SSCursor)  # type: ignore[no-any-return]
        return self._connection.cursor()  # type: ignore[no-any-return]

    def _all(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        cursor = self._cursor()
        try:
            cursor.execute(query, params)
            return cursor.fetchall()
        except Exception as exc:
            raise SqlStoreError(f"reading the store failed ({query.split()[3]}): {_one_line(exc)}") from None
        finally:
            cursor.close()

    def read(self) -> StanStore:
        server = self._server()
        clients = self._clients()
        channels = [self._channel(cid, name, maxseq) for cid, name, maxseq in self._channels()]
        return StanStore(server, clients, channels, self._notes)

    def _server(self) -> ServerInfo:
        rows = self._all("SELECT id, proto, version FROM ServerInfo WHERE uniquerow = 1")
        if not rows:
            raise SqlStoreError("the database holds no ServerInfo row: not a nats-streaming-server store")
        cluster, proto, version = rows[0]
        if version != 1:
            raise SqlStoreError(f"ServerInfo says store version {version}; this importer reads version 1")
        info = _parse(ServerInfo, proto, "the ServerInfo row")
        if info.ClusterID != cluster:
            raise SqlStoreError(f"ServerInfo names cluster {info.ClusterID!r} in its protobuf, {cluster!r} in its id")
        return info

    def _clients(self) -> dict[str, ClientInfo]:
        found: dict[str, ClientInfo] = {}
        for client_id, hb_inbox, proto in self._all("SELECT id, hbinbox, proto FROM Clients"):
            if proto:
                found[client_id] = _parse(ClientInfo, proto, f"client {client_id!r}")
            else:  # written before the server kept the protobuf
                found[client_id] = ClientInfo(ID=client_id, HbInbox=hb_inbox)
        return found

    def _channels(self) -> list[tuple[int, str, int]]:
        rows = self._all("SELECT id, name, maxseq FROM Channels WHERE deleted = FALSE ORDER BY name")
        return [(int(cid), str(name), int(maxseq or 0)) for cid, name, maxseq in rows]

    def _channel(self, cid: int, name: str, maxseq: int) -> StanChannel:
        ((count, first, last, size),) = self._all(
            "SELECT COUNT(seq), COALESCE(MIN(seq), 0), COALESCE(MAX(seq), 0), COALESCE(SUM(size), 0) "
            "FROM Messages WHERE id = %s",
            cid,
        )
        subs = self._subscriptions(cid, name)
        first, last, count = int(first), max(int(last), maxseq), int(count)
        if not count:  # every message gone: the channel goes on after the last it had
            last = max([last] + [s.state.lastSent for s in subs])
            first = last + 1
        decryptor = (
            ChannelDecryptor(self.options.encryption_key, name) if self.options.encryption_key is not None else None
        )

        def messages(progress: Progress | None = None) -> Iterator[Message]:
            yield from self._messages(cid, name, count, decryptor, progress)

        return StanChannel(name, first, last, count, int(size) + RECORD_OVERHEAD * count, subs, messages)

    def _messages(
        self, cid: int, name: str, count: int, decryptor: ChannelDecryptor | None, progress: Progress | None
    ) -> Iterator[Message]:
        cursor = self._cursor(streaming=True)
        looks = LooksEncrypted(name) if decryptor is None else None
        read = 0
        try:
            cursor.execute("SELECT seq, data FROM Messages WHERE id = %s ORDER BY seq", (cid,))
            while rows := cursor.fetchmany(FETCH):
                for seq, raw in rows:
                    msg = MsgProto()
                    try:
                        msg.ParseFromString(bytes(raw))
                    except DecodeError as exc:
                        raise SqlStoreError(f"channel {name!r} message {seq}: not a valid message ({exc})") from None
                    if msg.sequence != seq:
                        raise SqlStoreError(f"channel {name!r}: the row of message {seq} holds message {msg.sequence}")
                    body = msg.data
                    if body and decryptor is not None:
                        try:
                            body = decryptor.decrypt(body)
                        except DecryptionError as exc:
                            raise DecryptionError(f"channel {name!r} message {seq}: {exc}") from None
                    elif body and looks is not None and not looks.see(body):
                        looks = None  # one payload in the clear: the channel is not encrypted
                    yield Message(int(seq), msg.timestamp, name, msg.reply, body)
                read += len(rows)
                if progress is not None:
                    progress(len(rows))
        finally:
            cursor.close()
        if read != count:
            raise SqlStoreError(f"channel {name!r}: {read} messages read where {count} were counted (is it in use?)")
        if looks is not None:
            looks.check()

    def _subscriptions(self, cid: int, name: str) -> list[StanSubscription]:
        subs = []
        query = "SELECT lastsent, proto FROM Subscriptions WHERE id = %s AND deleted = FALSE ORDER BY subid"
        row_name = "`row`" if self.driver == "mysql" else "row"
        for lastsent, proto in self._all(query, cid):
            state = _parse(SubState, proto, f"a subscription of channel {name!r}")
            sub = StanSubscription(state)
            state.lastSent = max(state.lastSent, int(lastsent or 0))
            rows = self._all(
                f"SELECT {row_name}, seq, lastsent, pending, acks FROM SubsPending WHERE subid = %s "
                f"ORDER BY {row_name}",  # the rows' order matters: an ack cancels what came before it
                state.ID,
            )
            for _, seq, row_last, pending, acks in rows:
                state.lastSent = max(state.lastSent, int(row_last or 0))
                if seq:
                    sub.pending.add(int(seq))
                    continue
                sub.pending.difference_update(_seqs(acks, name))  # an ack cancels a pending of an earlier row
                sub.pending.update(_seqs(pending, name))
            if sub.pending:
                state.lastSent = max(state.lastSent, max(sub.pending))
            subs.append(sub)
        return subs


def _one_line(exc: Exception) -> str:
    """A driver's message (PostgreSQL's run over several lines) as one line."""
    return " ".join(str(exc).split())


def _seqs(raw: Any, channel: str) -> list[int]:
    if not raw:
        return []
    try:
        found = json.loads(bytes(raw))
    except ValueError:
        raise SqlStoreError(f"channel {channel!r}: a SubsPending row is not a JSON array of sequences") from None
    if not isinstance(found, list) or not all(isinstance(s, int) for s in found):
        raise SqlStoreError(f"channel {channel!r}: a SubsPending row is not a JSON array of sequences")
    return found


def _parse(cls: type[M], raw: Any, what: str) -> M:
    parsed = cls()
    try:
        parsed.ParseFromString(bytes(raw or b""))
    except DecodeError as exc:
        raise SqlStoreError(f"{what} is not a valid {cls.__name__} ({exc})") from None
    return parsed


def _connect(driver: str, source: str) -> Any:
    """A connection with the driver's Python client (psycopg, PyMySQL: `pip install 'streaming-server[sql]'`)."""
    try:
        if driver == "postgres":
            import psycopg

            connection = psycopg.connect(source, autocommit=False)
            connection.read_only = True
            return connection
        import pymysql

        found = _MYSQL_DSN.match(source)
        if found is None:
            raise SqlStoreError(f"not a MySQL DSN such as user:password@tcp(host:3306)/db: {source!r}")
        host, _, port = (found.group("address") or "127.0.0.1:3306").partition(":")
        return pymysql.connect(
            host=host,
            port=int(port or 3306),
            user=found.group("user") or "root",
            password=found.group("password") or "",
            database=found.group("db"),
        )
    except ImportError as exc:
        raise SqlStoreError(f"reading a SQL store needs {exc.name}: pip install 'streaming-server[sql]'") from None
    except SqlStoreError:
        raise
    except Exception as exc:
        raise SqlStoreError(f"cannot connect to the {driver} store: {_one_line(exc)}") from None
