"""What the engine holds per subscription, queue group and client (sans-IO records, no behaviour but
their own arithmetic and a group's choice of member), and the requests it is given.

Queue groups: members share one position and take turns. A new message goes to the member with the
fewest pending messages that is not failing heartbeats, not stalled at MaxInflight (or its window)
and has nothing due; ties go in turn. `Group.share` hands out a read's messages that way as one block
per member (the counts a message-by-message choice would give). A message that comes back after
AckWait or a nak goes to the member `Group.pick` chooses, and a leaving member's go round-robin to the
others (the engine's `_hand_over`), due at once. An empty durable group keeps its state as a "shadow"
for the members to come.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container

import attrs

from storage.records import StartPosition, SubOptions, SubscriptionRecord
from streaming.core.engine.events import SubRef
from streaming.core.engine.pending import PendingSet, SharedPendingSet
from streaming.wire.subjects import matches


@attrs.frozen(slots=True)
class SubscribeRequest:
    client_id: str
    channel: str
    inbox: str
    ack_inbox: str
    ack_wait_ms: int
    max_inflight: int
    durable_name: str = ""
    queue_group: str = ""
    start_position: StartPosition = StartPosition.NEW_ONLY
    start_sequence: int = 0
    start_time_delta_ns: int = 0
    options: SubOptions = attrs.field(factory=SubOptions)
    # Deliveries on demand (a pull door's consumer): nothing new is sent until the door opens the
    # subscription's window with `Engine.set_window`.
    on_demand: bool = False
    # A wildcard subscription only: patterns of channels it must not follow (those its user may not
    # read, when the user's permissions deny part of what the pattern matches).
    exclude: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.ack_wait_ms <= 0 or self.max_inflight <= 0:
            raise ValueError("ack_wait_ms and max_inflight must be positive (the protocol layer checks this)")


class Sub:
    """One subscription: plain, durable, queue member, the offline shadow of a durable group, or the
    part of a wildcard subscription that follows one channel (`wild`: that wildcard)."""

    __slots__ = ("group", "last_sent", "online", "pending", "record", "ref", "wild", "window")

    def __init__(
        self, record: SubscriptionRecord, group: Group | None, online: bool, wild: Wildcard | None = None
    ) -> None:
        self.record = record
        self.wild = wild
        # How many pending messages it may hold before new ones wait: its MaxInflight, or for a
        # subscription on demand what its door opened (`Engine.set_window`), never more.
        self.window = record.max_inflight
        self.group = group
        self.online = online
        self.last_sent = record.last_sent
        self.pending = PendingSet() if wild is None else SharedPendingSet(wild)
        self.ref = ref(record)

    def delay(self, attempt: int) -> float:
        backoff = self.record.options.backoff_ms
        if backoff:
            return backoff[min(attempt, len(backoff)) - 1] / 1000
        return self.record.ack_wait_ms / 1000

    @property
    def stalled(self) -> bool:
        if len(self.pending) >= self.window:
            return True
        wild = self.wild
        return wild is not None and wild.count >= wild.record.max_inflight

    def room(self) -> int:
        """How many new messages it may take now (its window, and a wildcard's MaxInflight across its
        channels)."""
        room = self.window - len(self.pending)
        wild = self.wild
        return room if wild is None else min(room, wild.record.max_inflight - wild.count)


class Wildcard:
    """A subscription to a pattern (`orders.*`, `orders.>`): one part (a `Sub` with `wild` set) per
    channel it follows, each with that channel's own position, pending messages and timer, made for
    the matching channels when it subscribes and for each matching channel that appears later.

    MaxInflight bounds the messages pending across all its channels (`count`, kept by each part's
    `SharedPendingSet`); parts that have new messages but no room wait in `waiting`, in turn, for the
    room an ack makes. `exclude`: its record's patterns of channels it may not follow (its user's
    denied subjects), split into tokens.
    """

    __slots__ = ("count", "exclude", "group", "online", "parts", "record", "stalled_groups", "tokens", "waiting")

    def __init__(self, record: SubscriptionRecord, online: bool, group: WildGroup | None = None) -> None:
        self.record = record
        self.group = group  # the wildcard queue group it is a member (or the shadow) of
        self.tokens = record.channel.split(".")
        self.exclude = [pattern.split(".") for pattern in record.exclude]
        self.online = online
        self.parts: dict[str, Sub] = {}  # channel -> its part
        self.count = 0  # pending messages across the parts
        # Parts (sub ids) with new messages waiting for room, in turn; and for a queue group member, the
        # channels' groups that found no member with room. OrderedDicts, not dicts: they are taken from
        # the front one at a time, and a dict's first entry after deleting those before it is found by
        # walking over their empty slots.
        self.waiting: OrderedDict[int, None] = OrderedDict()
        self.stalled_groups: OrderedDict[Group, None] = OrderedDict()

    def follows(self, channel: str) -> bool:
        """Whether `channel` is one of its channels (matched, and not excluded)."""
        tokens = channel.split(".")
        return matches(self.tokens, tokens) and not any(matches(p, tokens) for p in self.exclude)


class WildGroup:
    """A queue group on a pattern: its members are wildcard subscriptions, and on each channel their
    parts form an ordinary `Group` (named `channel_key`), so that channel's messages are shared
    among them as on a queue group on that channel; an empty durable group keeps its last member as
    `shadow`. `ordered`: each channel's `Group` is ordered, which spreads the channels over the members
    while keeping each one's order."""

    __slots__ = ("durable", "key", "members", "ordered", "pattern", "shadow")

    def __init__(self, pattern: str, key: str, durable: bool, ordered: bool) -> None:
        self.pattern = pattern
        self.key = key
        self.durable = durable
        self.ordered = ordered
        self.members: list[Wildcard] = []
        self.shadow: Wildcard | None = None

    @property
    def channel_key(self) -> str:
        """Its groups' name on each channel (a space cannot be in a pattern or a group name, so it
        never meets a queue group on the channel itself)."""
        return f"{self.pattern} {self.key}"


@attrs.frozen
class SubscriptionView:
    """A read-only snapshot of one subscription for monitoring."""

    record: SubscriptionRecord  # last_sent is the current position (the group's, for queue members)
    online: bool
    pending_count: int  # unacknowledged messages, sent or waiting to be redelivered
    stalled: bool  # at MaxInflight (or its window): nothing new goes out until something is acked


class Client:
    __slots__ = ("hb_failed", "subs")

    def __init__(self) -> None:
        self.hb_failed = False
        self.subs: set[int] = set()


def ref(record: SubscriptionRecord) -> SubRef:
    return SubRef(record.channel, record.sub_id, record.client_id, record.durable_name, record.queue_group)


class Group:
    """A queue group: members share one position; `shadow` keeps an empty durable group's state.
    `ordered`: the channel's messages go out one at a time (the next once the last is acked), so its
    members never work on two of them at once."""

    __slots__ = ("channel", "durable", "last_sent", "members", "name", "ordered", "shadow")

    def __init__(self, channel: str, name: str, durable: bool, last_sent: int, ordered: bool = False) -> None:
        self.channel = channel
        self.name = name
        self.durable = durable
        self.last_sent = last_sent
        self.ordered = ordered
        self.members: list[Sub] = []
        self.shadow: Sub | None = None

    def holds_any(self) -> bool:
        """Whether a member has a message of the group pending (an ordered group sends nothing new then)."""
        return any(len(member.pending) for member in self.members)

    def pick(self, *, failed: Container[Sub] = ()) -> Sub:
        """The member to give a message back to (one that came back after AckWait or a nak): the one
        with the fewest pending that is not failing heartbeats, ties in turn; `failed`: the members
        failing heartbeats."""
        best: Sub | None = None
        fewest = 0
        for member in self.members:
            if member in failed:
                continue
            size = len(member.pending) if member.wild is None else member.wild.count
            if best is None or size < fewest:
                best, fewest = member, size
        if best is None:
            best = self.members[0]
        if best is self.members[0] and len(self.members) > 1:
            self.members.append(self.members.pop(0))
        return best

    def share(self, count: int, failed: Container[Sub] = ()) -> list[tuple[Sub, int]]:
        """How `count` new messages go to the members: as a message-by-message choice of the member
        with the fewest pending (ties in turn) would spread them, but as blocks, (member, how many) in
        turn. Only members with room and nothing due take new messages, and none past its room, so the
        blocks may add up to fewer than `count` (none: no member can take one now). The members that
        took some go to the back of the turn, in order."""
        loads: list[int] = []
        rooms: list[int] = []
        takers: list[Sub] = []
        for member in self.members:
            if member in failed or member.pending.due_count:
                continue
            room = member.room()
            if room > 0:
                wild = member.wild
                loads.append(len(member.pending) if wild is None else wild.count)
                rooms.append(room)
                takers.append(member)
        if not takers:
            return []
        given, last = share_out(loads, rooms, count)
        plan = [(member, n) for member, n in zip(takers, given, strict=True) if n]
        if len(self.members) > 1:
            # The turn goes on from where a message-by-message choice would leave it: those served
            # go to the back, the ones that took a message in its last round last of all.
            latest = [takers[i] for i in last]
            later = {id(m) for m in latest}
            back = [m for m, _ in plan if id(m) not in later] + latest
            served = {id(m) for m in back}
            self.members = [m for m in self.members if id(m) not in served] + back
        return plan


def share_out(loads: list[int], rooms: list[int], count: int) -> tuple[list[int], list[int]]:
    """How many of `count` each of these members takes when each one goes to the least loaded member
    with room left, ties to the earlier member: the lowest loads are raised level by level (water
    filling), so the work is per level, not per message. Also which members took one in the last,
    unfinished round of equal shares (none when it finished)."""
    given = [0] * len(loads)
    order = sorted(range(len(loads)), key=loads.__getitem__)  # stable: ties keep their turn
    level = loads[order[0]]
    active: list[int] = []  # members at `level` with room left, in turn
    joined = 0
    while count:
        while joined < len(order) and loads[order[joined]] <= level:
            active.append(order[joined])
            joined += 1
        active = [i for i in active if given[i] < rooms[i]]
        if not active:
            if joined == len(order):
                break
            level = loads[order[joined]]
            continue
        step = min(rooms[i] - given[i] for i in active)
        if joined < len(order):
            step = min(step, loads[order[joined]] - level)
        if step * len(active) >= count:  # the last level: an equal part each, the rest to the first in turn
            each, rest = divmod(count, len(active))
            turn = sorted(active)
            for rank, i in enumerate(turn):
                given[i] += each + (rank < rest)
            return given, turn[:rest]
        for i in active:
            given[i] += step
        count -= step * len(active)
        level += step
    return given, []


def group_key(request_durable: str, queue_group: str) -> str:
    return f"{request_durable}:{queue_group}" if request_durable else queue_group
