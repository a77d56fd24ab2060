"""The least a STAN server on Trio can do per message: the floor under server CPU per message.

    python bench/stan_floor.py PORT DIR

Serves NATS and STAN on loopback PORT well enough for node-nats-streaming (`bench/node/clients.js`)
to connect, publish pipelined, subscribe (plain or in a queue group, MaxInflight honoured, from the
first message) and ack, and for `bench.peers.wait_stan` to see it answer. Per message it does only
what any server of this protocol on this stack has to, each step done the cheapest way the server
itself does it:
- a publish: find and split its PUB frame, decode the PubMsg, keep the payload in a list and the
  PubMsg's bytes in a file (`bench/floor_log.py`: one write and one fdatasync per read of a
  connection, as a group commit), then encode its PubAck and frame it with the others of that read;
- a delivery: encode its MsgProto (one message object re-filled), frame a run of them in one join;
- an ack: find and split its PUB frame, decode the Ack, drop the sequence from the subscription's
  pending set, and send what the room it made lets through.
Nothing else: no store index or checksum, no subscription state written, no AckWait or redelivery,
no heartbeats, limits, metrics or logs, no queue-group fairness beyond giving each member what it
has room for, and no checks of what clients send (it is not a server for anything but this
measurement). `bench/stan_pairs.py` runs it in the same rounds as ours and nats-streaming-server:
its CPU per message against nats-streaming-server's is about the least a server built like ours
(Python, Trio, this protobuf runtime) could spend on this machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.floor_log import FloorLog
from streaming.wire.nats import encode_msgs
from streaming.wire.stan_pb import protocol_pb2 as pb

_INFO = b'INFO {"server_id":"floor","version":"2.9.24","proto":1,"max_payload":1048576}\r\n'
_DISCOVER = b"_STAN.discover.test-cluster"
_PUB = "_STAN.pub.floor"
_REQUESTS = {
    "sub": "_STAN.sub.floor",
    "unsub": "_STAN.unsub.floor",
    "close": "_STAN.close.floor",
    "subclose": "_STAN.subclose.floor",
    "ping": "_STAN.ping.floor",
}


class Conn:
    """A client connection: its stream, what waits to be written to it, its subscriptions by sid."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.out: list[bytes] = []
        self.lock = trio.StrictFIFOLock()
        self.subjects: dict[bytes, bytes] = {}  # sid -> subject


class Sub:
    """A STAN subscription (or a queue group's member): where it gets messages and what it holds."""

    def __init__(
        self, conn: Conn, sid: str, inbox: str, channel: Channel, max_inflight: int, group: Group | None
    ) -> None:
        self.conn, self.sid, self.inbox, self.channel = conn, sid, inbox, channel
        self.max_inflight = max_inflight
        self.pending: set[int] = set()
        self.next = 0  # index of the next message to send (a plain subscription's own cursor)
        self.group = group


class Group:
    """A queue group: one cursor its members share."""

    def __init__(self) -> None:
        self.next = 0


class Channel:
    def __init__(self, name: str) -> None:
        self.name = name
        self.data: list[bytes] = []
        self.stamps: list[int] = []
        self.subs: list[Sub] = []
        self.groups: dict[str, Group] = {}


class Floor:
    def __init__(self, directory: Path) -> None:
        self._log = FloorLog(directory / "floor-journal")
        self._routes: dict[bytes, tuple[Conn, str]] = {}  # literal subject -> receiver
        self._wildcards: dict[bytes, tuple[Conn, str]] = {}  # "<prefix>" of "<prefix>.*" -> receiver
        self._channels: dict[str, Channel] = {}
        self._acks: dict[bytes, Sub] = {}  # ack inbox -> subscription
        self._requests = {subject.encode(): kind for kind, subject in _REQUESTS.items()}
        self._pub_prefix = (_PUB + ".").encode()
        # What one read of a connection produced, carried out at its end.
        self._records: list[bytes] = []
        self._replies: dict[bytes, list[bytes]] = {}
        self._touched: set[Channel] = set()
        self._dirty: set[Conn] = set()

    async def serve(self, stream: trio.SocketStream) -> None:
        conn = Conn(stream)
        try:
            await stream.send_all(_INFO)
            buf = b""
            while data := await stream.receive_some(65536):
                buf = buf + data if buf else data
                buf = self._parse(conn, buf)
                await self._finish()
        except trio.BrokenResourceError:
            pass
        finally:
            self._drop(conn)

    def _parse(self, conn: Conn, buf: bytes) -> bytes:
        """Carry out every whole operation in `buf`; returns what is left of it."""
        pos, size = 0, len(buf)
        while (eol := buf.find(b"\r\n", pos)) >= 0:
            if buf.startswith(b"PUB ", pos):
                head = buf[pos + 4 : eol].split()
                start = eol + 2
                end = start + int(head[-1])
                if end + 2 > size:
                    break
                self._pub(conn, head[0], head[1] if len(head) == 3 else b"", buf[start:end])
                pos = end + 2
                continue
            line, pos = buf[pos:eol], eol + 2
            if line.startswith(b"PING"):
                conn.out.append(b"PONG\r\n")
                self._dirty.add(conn)
            elif line.startswith(b"SUB "):
                parts = line.split()
                subject, sid = parts[1], parts[-1]
                conn.subjects[sid] = subject
                receiver = (conn, sid.decode())
                if subject.endswith(b".*"):
                    self._wildcards[subject[:-2]] = receiver
                else:
                    self._routes[subject] = receiver
            elif line.startswith(b"UNSUB "):
                parts = line.split()
                if len(parts) == 2 and (gone := conn.subjects.pop(parts[1], None)) is not None:
                    self._routes.pop(gone, None)
                    self._wildcards.pop(gone[:-2], None)
        return buf[pos:]

    def _pub(self, conn: Conn, subject: bytes, reply: bytes, payload: bytes) -> None:
        sub = self._acks.get(subject)
        if sub is not None:
            sub.pending.discard(pb.Ack.FromString(payload).sequence)
            self._touched.add(sub.channel)
            return
        if subject.startswith(self._pub_prefix):
            msg = pb.PubMsg.FromString(payload)
            channel = self._channel(msg.subject)
            channel.data.append(msg.data)
            channel.stamps.append(time.time_ns())
            self._records.append(payload)
            self._touched.add(channel)
            if reply:
                self._replies.setdefault(reply, []).append(pb.PubAck(guid=msg.guid).SerializeToString())
            return
        if subject == _DISCOVER:
            answer = pb.ConnectResponse(
                pubPrefix=_PUB,
                subRequests=_REQUESTS["sub"],
                unsubRequests=_REQUESTS["unsub"],
                closeRequests=_REQUESTS["close"],
                subCloseRequests=_REQUESTS["subclose"],
                pingRequests=_REQUESTS["ping"],
                pingInterval=5,
                pingMaxOut=3,
                protocol=1,
            )
            self._reply(reply, answer.SerializeToString())
        elif (kind := self._requests.get(subject)) == "sub":
            self._subscribe(conn, reply, pb.SubscriptionRequest.FromString(payload))
        elif kind == "ping":
            self._reply(reply, pb.PingResponse().SerializeToString())
        elif kind == "close":
            self._reply(reply, pb.CloseResponse().SerializeToString())
        elif kind is not None:
            self._reply(reply, pb.SubscriptionResponse().SerializeToString())

    def _reply(self, to: bytes, payload: bytes) -> None:
        self._replies.setdefault(to, []).append(payload)

    def _channel(self, name: str) -> Channel:
        channel = self._channels.get(name)
        if channel is None:
            channel = self._channels[name] = Channel(name)
        return channel

    def _subscribe(self, conn: Conn, reply: bytes, request: pb.SubscriptionRequest) -> None:
        channel = self._channel(request.subject)
        inbox = request.inbox.encode()
        receiver = self._routes.get(inbox)
        if receiver is None:
            self._reply(reply, pb.SubscriptionResponse(error="no subscription on the inbox").SerializeToString())
            return
        group = None
        if request.qGroup:
            group = channel.groups.setdefault(request.qGroup, Group())
        sub = Sub(receiver[0], receiver[1], request.inbox, channel, request.maxInFlight or 1024, group)
        channel.subs.append(sub)
        ack_inbox = f"_STAN.ack.floor.{len(self._acks)}"
        self._acks[ack_inbox.encode()] = sub
        # The answer goes first: the client learns the ack inbox before the first message.
        self._reply(reply, pb.SubscriptionResponse(ackInbox=ack_inbox).SerializeToString())
        self._touched.add(channel)

    def _send(self, sub: Sub, channel: Channel, start: int, end: int) -> None:
        msg = pb.MsgProto(subject=channel.name)  # for this run only: its memory grows by each payload
        serialize = msg.SerializeToString
        data, stamps = channel.data, channel.stamps
        run = []
        for i in range(start, end):
            msg.sequence = i + 1
            msg.data = data[i]
            msg.timestamp = stamps[i]
            run.append(serialize())
        sub.pending.update(range(start + 1, end + 1))
        sub.conn.out.append(encode_msgs(sub.inbox, sub.sid, run))
        self._dirty.add(sub.conn)

    def _refill(self, channel: Channel) -> None:
        available = len(channel.data)
        for sub in channel.subs:
            room = sub.max_inflight - len(sub.pending)
            cursor = sub.group if sub.group is not None else sub
            if room > 0 and cursor.next < available:
                end = min(available, cursor.next + room)
                self._send(sub, channel, cursor.next, end)
                cursor.next = end

    async def _finish(self) -> None:
        """The end of a read: its publishes made durable, then its answers (a subscription's before its
        first message) and deliveries written."""
        if self._records:
            record = b"".join(self._records)
            self._records = []
            self._log.append(record)
        if self._replies:
            for to, payloads in self._replies.items():
                receiver = self._routes.get(to) or self._wildcards.get(to.rpartition(b".")[0])
                if receiver is not None:
                    receiver[0].out.append(encode_msgs(to.decode(), receiver[1], payloads))
                    self._dirty.add(receiver[0])
            self._replies = {}
        if self._touched:
            for channel in self._touched:
                self._refill(channel)
            self._touched = set()
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            for conn in dirty:
                out, conn.out = b"".join(conn.out), []
                async with conn.lock:
                    await conn.stream.send_all(out)

    def _drop(self, conn: Conn) -> None:
        for subject in conn.subjects.values():
            self._routes.pop(subject, None)
            self._wildcards.pop(subject[:-2], None)
        for channel in self._channels.values():
            channel.subs = [s for s in channel.subs if s.conn is not conn]
        self._acks = {inbox: s for inbox, s in self._acks.items() if s.conn is not conn}
        self._dirty.discard(conn)


async def main(port: int, directory: Path) -> None:
    floor = Floor(directory)
    await trio.serve_tcp(floor.serve, port, host="127.0.0.1")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), Path(sys.argv[2]))
