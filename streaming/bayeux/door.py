"""The Bayeux front door: Bayeux requests become engine calls, engine deliveries become session queues.

It is an adapter on the delivery core like the STAN door:
- a Bayeux publish is a `Publish` handed to the core's group commit; its reply waits for the commit
  (a `Ticket` per run of a request's publishes);
- a `/meta/subscribe` opens a non-durable engine subscription (new messages only) for the session's
  engine client (`bayeux:<a public id>`: a name no STAN client can register; the clientId itself,
  the session's credential, is shown nowhere). Its AckWait is longer
  than any session lives and its MaxInflight is `max_unacked`: redelivery is by batch (see
  `streaming.bayeux.protocol`), and what the client has not acknowledged waits in the log;
- the engine delivers to the door's outbound port (inboxes under `_BAYEUX.`), which queues the
  message in its session and wakes the session's held connect;
- the acknowledgements a connect carries are engine acks, one span per request (one state write).
- a `/meta/subscribe` with `ext.durable: NAME` opens (or resumes) a durable engine subscription for
  the engine client `bayeux:d:NAME` instead: when the session ends (disconnect, expiry, a restart)
  the durable keeps its position and its unacknowledged messages, and the next session that
  subscribes with that name gets those first (the engine redelivers them on resume), then new ones.
Sessions live in memory: after a restart (or expiry, or disconnect) a client handshakes again; its
plain subscriptions start at new messages, as with CometD, and its durables go on where they were.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import attrs
import trio

from streaming.bayeux import channels
from streaming.bayeux import protocol as bx
from streaming.core.door_api import DoorApi, Ticket
from streaming.core.errors import ChannelBeingDeleted, NotPermitted, RequestError, StoreError
from streaming.core.outbound import Delivery, Message, Outcome, Publish, SubscribeRequest
from streaming.security.permissions import Compiled

log = logging.getLogger(__name__)

INBOX_PREFIX = "_BAYEUX."
_ENGINE_CLIENT = "bayeux:"  # STAN client IDs cannot hold ':', so no STAN client can act for a session
_DURABLE_CLIENT = "bayeux:d:"  # + the durable name: the engine client a durable belongs to across sessions
# Longer than a session can sensibly live: batches, not timers, redeliver to Bayeux subscribers (and
# the door drops an engine redelivery of a message still queued, so nothing is queued twice).
_ACK_WAIT_MS = 2**31 - 1
_META_UNKNOWN = "400::channel_unknown"


@attrs.frozen
class BayeuxStatistics:
    sessions: int
    held_connects: int
    queued_messages: int  # waiting to be sent or acknowledged, over every session
    handshakes: int
    expired_sessions: int
    batches: int  # connect replies that closed a batch
    delivered_messages: int  # messages written into connect replies, resends included
    resent_messages: int
    published_messages: int
    websockets: int  # open WebSocket connections


class _Hold:
    """A held `/meta/connect`: woken by a delivery, a newer connect or a disconnect."""

    __slots__ = ("disconnected", "event", "superseded")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.superseded = False
        self.disconnected = False


class _Live:
    __slots__ = ("durable_clients", "durable_subs", "engine_client", "hold", "public_id", "session")

    def __init__(self, session: bx.Session) -> None:
        self.session = session
        # The clientId is the session's credential: monitoring pages, the event log and metrics see
        # this other name for it instead.
        self.public_id = secrets.token_hex(8)
        self.engine_client = _ENGINE_CLIENT + self.public_id
        self.hold: _Hold | None = None
        self.durable_clients: set[str] = set()  # the durables' engine clients this session holds
        self.durable_subs: set[int] = set()  # its subscriptions that are durables


class _Staged:
    """A request's publishes not yet handed to the core, the messages they answer, and the channels
    this request may publish to, checked once each."""

    __slots__ = ("allowed", "answers", "publishes")

    def __init__(self) -> None:
        self.publishes: list[Publish] = []
        self.answers: list[tuple[int, dict[str, Any]]] = []  # (index in the request's answer, message)
        # Bayeux channel -> engine channel, for those that passed every check: a busy client sends a
        # request's publishes to one or a few channels, and the user's permissions stay as they are.
        self.allowed: dict[str, str] = {}


class Answer:
    """A request's answer before its publishes are committed: the replies in order (a publish's
    success stands in its place), and the tickets that settle them."""

    __slots__ = ("parts", "tickets")

    def __init__(
        self, parts: list[dict[str, Any] | bytes], tickets: list[tuple[Ticket, list[tuple[int, dict[str, Any]]]]]
    ) -> None:
        self.parts = parts
        self.tickets = tickets


class BayeuxDoor:
    def __init__(self, core: DoorApi, settings: bx.BayeuxSettings) -> None:
        self.core = core
        self.settings = settings
        self._sessions: dict[str, _Live] = {}
        # engine sub id -> its session, and its Bayeux channel as JSON
        self._by_sub: dict[int, tuple[_Live, bytes]] = {}
        self._parts: dict[int, list[int]] = {}  # a wildcard subscription -> its parts noted in `_by_sub`
        self._durable_holders: dict[str, _Live] = {}  # a durable's engine client -> the session holding it
        self._next = 0
        self._handshakes = self._expired = self._batches = self._delivered = self._resent = self._published = 0
        self.websockets = 0  # kept by the WebSocket endpoint
        core.add_door(self, INBOX_PREFIX)

    def statistics(self) -> BayeuxStatistics:
        return BayeuxStatistics(
            sessions=len(self._sessions),
            held_connects=sum(1 for live in self._sessions.values() if live.hold is not None),
            queued_messages=sum(len(live.session.unacked) for live in self._sessions.values()),
            handshakes=self._handshakes,
            expired_sessions=self._expired,
            batches=self._batches,
            delivered_messages=self._delivered,
            resent_messages=self._resent,
            published_messages=self._published,
            websockets=self.websockets,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Expire sessions that stopped connecting, every `sweep_s`, until cancelled."""
        task_status.started()
        while True:
            await trio.sleep(self.settings.sweep_s)
            self.expire(trio.current_time())

    def expire(self, now: float) -> None:
        for live in [live for live in self._sessions.values() if live.session.expires_at <= now]:
            log.debug("bayeux session %s expired", live.public_id)
            self._expired += 1
            self._end(live)

    # -- requests ------------------------------------------------------------------------------

    async def handle(self, messages: list[Any], permissions: Compiled | None = None) -> list[dict[str, Any] | bytes]:
        """Answer one request's messages, in order: replies, and deliveries already encoded (first in
        a connect's answer). Publishes are answered once the last of them is committed. `permissions`:
        the channels the request's user may publish and subscribe to (None: all)."""
        return await self.finish(await self.begin(messages, permissions))

    async def begin(self, messages: list[Any], permissions: Compiled | None = None, source: object = None) -> Answer:
        """The first half of `handle`: every message acted on, its publishes handed to the group
        commit, in order. A WebSocket reads its next frame once this returns, and `finish`es the
        answer meanwhile, so a client's frames reach the log in the order it sent them."""
        await self.core.wait_ready()
        out: list[dict[str, Any] | bytes] = []
        staged = _Staged()  # publishes not yet handed over: one run each time, before any await
        tickets: list[tuple[Ticket, list[tuple[int, dict[str, Any]]]]] = []
        alone = len(messages) == 1
        touched: _Live | None = None  # a request's messages keep their session alive once, not each
        for message in messages:
            bad = bx.check(message)
            if bad is not None:
                out.append(bad)
                continue
            channel: str = message["channel"]
            if staged.publishes and (channel.startswith("/meta/") or channel == "/meta"):
                tickets.append(await self._submit(staged, source))
            if channel == "/meta/handshake":
                out.append(self._handshake(message, alone))
                continue
            client_id = message.get("clientId")
            live = self._sessions.get(client_id) if isinstance(client_id, str) else None
            if live is None:
                out.append(bx.session_unknown(message))
                continue
            if channel == "/meta/connect":
                out.extend(await self._connect(live, message, alone))
                continue
            if live is not touched:
                self._touch(live)
                touched = live
            if channel == "/meta/disconnect":
                self._end(live)
                out.append(bx.reply(message, successful=True))
            elif channel == "/meta/subscribe":
                out.append(await self._subscribe(live, message, permissions))
            elif channel == "/meta/unsubscribe":
                out.append(self._unsubscribe(live, message))
            elif channels.is_meta(channel):
                out.append(bx.error(message, _META_UNKNOWN))
            else:
                out.append(self._stage(message, len(out), permissions, staged))
        if staged.publishes:
            tickets.append(await self._submit(staged, source))
        return Answer(out, tickets)

    def commit_now(self) -> None:
        """A lone publisher's publishes `begin` handed over are committed now (see `DoorApi.commit_now`)."""
        self.core.commit_now()

    def answered(self, answer: Answer) -> list[dict[str, Any] | bytes] | None:
        """`finish` without waiting: the answer, when every publish in it is committed already."""
        if not all(ticket.done for ticket, _ in answer.tickets):
            return None
        return self._settle(answer, [ticket.result for ticket, _ in answer.tickets])

    async def finish(self, answer: Answer) -> list[dict[str, Any] | bytes]:
        """The answer `begin` started, once its publishes are committed (or refused)."""
        return self._settle(answer, [await ticket.outcomes() for ticket, _ in answer.tickets])

    def _settle(self, answer: Answer, results: list[list[Outcome]]) -> list[dict[str, Any] | bytes]:
        out = answer.parts
        for (_, answers), outcomes in zip(answer.tickets, results, strict=True):
            for (index, message), outcome in zip(answers, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    out[index] = bx.error(message, _publish_error(outcome))
                else:
                    self._published += 1
        return out

    def _handshake(self, message: dict[str, Any], alone: bool) -> dict[str, Any]:
        if not alone:
            return bx.error(message, bx.HANDSHAKE_ALONE)
        answer, session = bx.handshake(message, self.settings, trio.current_time())
        if session is not None:
            live = _Live(session)
            self._sessions[session.client_id] = live
            self.core.attach_client(live.engine_client)
            self._handshakes += 1
        return answer

    def _touch(self, live: _Live) -> None:
        session = live.session
        session.expires_at = max(session.expires_at, trio.current_time() + self.settings.max_interval_s)

    async def _connect(self, live: _Live, message: dict[str, Any], alone: bool) -> list[dict[str, Any] | bytes]:
        session, settings = live.session, self.settings
        if live.hold is not None:
            live.hold.superseded = True
            live.hold.event.set()
            live.hold = None
        ext = message.get("ext")
        naks = bx.naks_of(message)  # given back before `ext.ack` acknowledges their batch
        taken = None if naks is None else self._give_back(session.give_back(naks))
        self._ack(session.acknowledge(ext.get("ack") if isinstance(ext, dict) else None))
        session.expires_at = math.inf
        if alone and session.connected and not bx.client_wants_now(message) and not session.has_to_send():
            hold = live.hold = _Hold()
            try:
                with trio.move_on_after(settings.timeout_s):
                    await hold.event.wait()
            finally:
                if live.hold is hold:  # timed out, or cancelled (the client went away): expiry runs again
                    live.hold = None
                    session.expires_at = trio.current_time() + settings.interval_s + settings.max_interval_s
            if hold.superseded:
                return [bx.superseded_reply(message, settings)]
            if hold.disconnected:
                return [bx.disconnected_reply(message)]
        # No await from here to the return: the batch is closed and its messages chosen in one step.
        batch, entries, resent = session.close_batch()
        session.connected = True
        session.expires_at = trio.current_time() + settings.interval_s + settings.max_interval_s
        if batch is not None:
            self._batches += 1
        else:
            self._ack(entries)  # no acks will come: what is written is delivered, at most once
        self._delivered += len(entries)
        self._resent += resent
        return [*(e.message for e in entries if e.message), bx.connect_reply(message, batch, settings, taken)]

    def _ack(self, entries: list[bx.Entry]) -> None:
        if not entries:
            return
        core = self.core
        by_sub: dict[int, list[int]] = {}
        for entry in entries:
            by_sub.setdefault(entry.sub_id, []).append(entry.seq)
        with core.span():  # one pass and one state write for the request's acks
            for sub_id, seqs in by_sub.items():
                core.ack_many(sub_id, seqs)

    def _give_back(self, naks: list[tuple[int, int, float]]) -> int:
        """Negative acks of a session's deliveries: the engine sends each again after its delay."""
        if naks:
            with self.core.span():
                for sub_id, seq, delay in naks:
                    self.core.nak(sub_id, seq, delay)
        return len(naks)

    def _end(self, live: _Live) -> None:
        """Disconnect or expiry: the session, its subscriptions and its queue go; nothing queued is
        acknowledged to the engine."""
        session = live.session
        if self._sessions.pop(session.client_id, None) is None:
            return
        if live.hold is not None:
            live.hold.disconnected = True
            live.hold.event.set()
            live.hold = None
        core = self.core
        for sub_id in session.subscriptions.values():
            self._forget_sub(sub_id)
            core.unsubscribe(sub_id, close=sub_id in live.durable_subs)  # a durable keeps its position
        session.subscriptions.clear()
        session.clear()
        for client in live.durable_clients:
            self._durable_holders.pop(client, None)
            core.detach_client(client)
        live.durable_clients.clear()
        live.durable_subs.clear()
        core.detach_client(live.engine_client)

    async def _subscribe(self, live: _Live, message: dict[str, Any], permissions: Compiled | None) -> dict[str, Any]:
        names = bx.subscriptions_of(message)
        if isinstance(names, dict):
            return names
        subscription = message["subscription"]
        engine_names: dict[str, str] = {}
        for name in names:
            if channels.is_meta(name) or channels.is_service(name):
                return bx.error(message, bx.SUBSCRIBE_FAILED, subscription=subscription)
            engine_name = channels.pattern_to_engine(name) if channels.is_wildcard(name) else None
            if engine_name is None:
                if not channels.mappable(name):
                    return bx.error(message, bx.SUBSCRIBE_FAILED, subscription=subscription)
                engine_name = channels.to_engine(name)
            if isinstance(self.core.refusal(engine_name, "subscribe", permissions), NotPermitted):
                return bx.error(message, bx.SUBSCRIBE_DENIED, subscription=subscription)
            engine_names[name] = engine_name
        durable = bx.durable_of(message)
        if isinstance(durable, dict):
            return durable
        engine_client = live.engine_client if durable is None else _DURABLE_CLIENT + durable
        if self._held_by_another(engine_client, live):
            return bx.error(message, bx.DURABLE_IN_USE, subscription=subscription)
        session = live.session
        for name in names:
            if name in session.subscriptions:
                continue
            engine_channel = engine_names[name]
            pattern = channels.is_wildcard(name)
            self._next += 1
            inbox = f"{INBOX_PREFIX}{live.public_id}.{self._next}"
            request = SubscribeRequest(
                client_id=engine_client,
                channel=engine_channel,
                inbox=inbox,
                ack_inbox=inbox + ".acks",  # no broker subscription reaches it: only this door acks
                ack_wait_ms=_ACK_WAIT_MS,
                max_inflight=self.settings.max_unacked,
                durable_name=durable or "",
                # A wildcard leaves out the channels its user may not read.
                exclude=permissions.denied_within(engine_channel) if pattern and permissions is not None else (),
            )
            try:
                if not pattern:
                    await self.core.ensure_channel(engine_channel)
                if self._sessions.get(session.client_id) is not live:
                    return bx.session_unknown(message)  # it ended while the channel was made
                if self._held_by_another(engine_client, live):  # taken while the channel was made
                    return bx.error(message, bx.DURABLE_IN_USE, subscription=subscription)
                if durable is not None and engine_client not in live.durable_clients:
                    self.core.attach_client(engine_client)
                    self._durable_holders[engine_client] = live
                    live.durable_clients.add(engine_client)

                def answer(sub_id: int, name: str = name) -> None:
                    session.subscriptions[name] = sub_id
                    session.overlapping = session.overlapping or channels.is_wildcard(name)
                    if durable is not None:
                        live.durable_subs.add(sub_id)
                    self._by_sub[sub_id] = (live, json.dumps(name, ensure_ascii=False).encode())

                self.core.subscribe(request, answer)
            except (RequestError, StoreError) as exc:
                log.info("bayeux subscribe to %s refused: %s", name, exc)
                return bx.error(message, f"403:{_reason(exc)}:subscribe_failed", subscription=subscription)
        return bx.reply(message, successful=True, subscription=subscription)

    def _held_by_another(self, engine_client: str, live: _Live) -> bool:
        """Whether a durable's engine client is held by a session other than `live` (a session's own
        engine client never is)."""
        holder = self._durable_holders.get(engine_client)
        return holder is not None and holder is not live

    def _unsubscribe(self, live: _Live, message: dict[str, Any]) -> dict[str, Any]:
        names = bx.subscriptions_of(message)
        if isinstance(names, dict):
            return names
        session = live.session
        if any(name not in session.subscriptions for name in names):
            return bx.error(message, bx.CHANNEL_MISSING, subscription=message["subscription"])
        for name in names:
            sub_id = session.subscriptions.pop(name)
            self._forget_sub(sub_id)
            live.durable_subs.discard(sub_id)
            self.core.unsubscribe(sub_id)  # a durable too: unsubscribing ends it, as for STAN
        return bx.reply(message, successful=True, subscription=message["subscription"])

    def _stage(
        self, message: dict[str, Any], index: int, permissions: Compiled | None, staged: _Staged
    ) -> dict[str, Any] | bytes:
        """Check one publish and add it to `staged`, for the group commit; its answer (at `index`)
        stands once it is committed."""
        channel: str = message["channel"]
        engine_channel = staged.allowed.get(channel)
        if engine_channel is None or self.core.refusing:  # a channel being deleted is asked each time
            if channels.is_service(channel):
                return bx.reply(message, successful=True)  # no server-side handlers: not broadcast
            if not channels.mappable(channel):
                return bx.error(message, bx.CHANNEL_INVALID)
            engine_channel = channels.to_engine(channel)
            refusal = self.core.refusal(engine_channel, "publish", permissions)
            if isinstance(refusal, NotPermitted):
                return bx.error(message, bx.PUBLISH_DENIED)
            if isinstance(refusal, ChannelBeingDeleted):
                return bx.error(message, bx.PUBLISH_FAILED)
            staged.allowed[channel] = engine_channel
        data = bx.encode_data(message.get("data"))
        staged.publishes.append(Publish(engine_channel, data, content_type=bx.DATA_CONTENT_TYPE))
        staged.answers.append((index, message))
        return bx.published(message)

    async def _submit(self, staged: _Staged, source: object) -> tuple[Ticket, list[tuple[int, dict[str, Any]]]]:
        """Hand the staged publishes (one request's) to the group commit as one run; waits while the
        commit queue is full (back-pressure, as for a STAN publisher)."""
        publishes, answers = staged.publishes, staged.answers
        staged.publishes, staged.answers = [], []
        return await self.core.submit(publishes, source), answers

    # -- the outbound port ---------------------------------------------------------------------

    def deliver(self, deliveries: Sequence[Delivery]) -> None:
        woken: list[_Live] = []
        by_sub = self._by_sub
        sub_id = -1
        run: list[Message] = []
        owner: tuple[_Live, bytes] | None = None
        for d in deliveries:
            if d.sub_id != sub_id:  # a subscription's deliveries come in runs: one lookup, one queueing each
                self._queue_run(owner, sub_id, run, woken)
                sub_id, run = d.sub_id, []
                owner = by_sub.get(sub_id)
                if owner is None:
                    owner = self._part_owner(sub_id)
            if owner is not None:
                run.append(d.message)  # encoded when a connect reply carries it (`Entry.message`)
        self._queue_run(owner, sub_id, run, woken)
        for live in woken:
            if live.hold is not None:
                live.hold.event.set()
                live.hold = None

    def _part_owner(self, sub_id: int) -> tuple[_Live, bytes] | None:
        """A wildcard subscription's part (its share of one channel): the session of the subscription,
        and the part's own channel, which its messages name (noted for the next time)."""
        record = self.core.subscription(sub_id)
        if record is None or not record.parent_id:
            return None
        parent = self._by_sub.get(record.parent_id)
        if parent is None:
            return None
        owner = (parent[0], json.dumps(channels.from_engine(record.channel), ensure_ascii=False).encode())
        self._by_sub[sub_id] = owner
        self._parts.setdefault(record.parent_id, []).append(sub_id)
        return owner

    def _forget_sub(self, sub_id: int) -> None:
        """A subscription this door no longer delivers for, with the parts noted for it."""
        self._by_sub.pop(sub_id, None)
        for part in self._parts.pop(sub_id, ()):
            self._by_sub.pop(part, None)

    @staticmethod
    def _queue_run(owner: tuple[_Live, bytes] | None, sub_id: int, run: list[Message], woken: list[_Live]) -> None:
        if owner is None or not run:
            return
        live = owner[0]
        # A redelivery (a resumed or recovered durable's pending) is queued unless it still is:
        # batches, not the engine's timer, send a queued message again.
        if live.session.queue_run(sub_id, owner[1], run) and live.hold is not None:
            woken.append(live)

    def holding(self) -> AbstractContextManager[None]:
        return nullcontext()

    async def wait_reachable(self, inboxes: list[str]) -> None:
        return  # sessions do not outlive the process: nothing of theirs is recovered


def _reason(error: Exception) -> str:
    text = str(error) if isinstance(error, RequestError) else "store"
    return "".join(c if c.isalnum() or c == " " else " " for c in text).strip()


def _publish_error(error: Exception) -> str:
    return f"500:{_reason(error)}:publish_failed"
