"""The pull protocol without HTTP or a server: a consumer's steps, tags and acknowledgements as
streaming.pull.protocol decides them, with times as plain numbers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.core.outbound import MAX_NAK_DELAY_S, StartPosition
from streaming.pull import protocol as pp

SETTINGS = pp.PullSettings(ack_replay_window_s=60)


def consumer(**options: object) -> pp.Consumer:
    return pp.Consumer("c1", "orders", pp.ConsumerOptions(**options), "e0", now=0.0)  # type: ignore[arg-type]


def test_a_delivery_is_handed_out_under_a_tag_and_acked_once_by_it() -> None:
    c = consumer(ack_wait_s=30, max_inflight=2)
    c.offer(1, 111, b"one", attempt=1, now=1.0)
    assert c.window() == 0, "nothing handed out, no pull waiting: the engine sends nothing more"
    handout = c.take(now=2.0, wall_s=1000.0, serial="a")
    assert handout is not None and handout.seq == 1 and handout.count == 1 and handout.tag
    assert handout.deadline_unix_s == 1030.0 and c.window() == 1
    decision = c.decide(f'"{handout.tag}"', 1, acknowledge=True, now=3.0, settings=SETTINGS)
    assert decision.status == 204 and decision.action == "ack"
    c.settle(1, acknowledge=True, now=3.0)
    again = c.decide(f'"{handout.tag}"', 1, acknowledge=True, now=4.0, settings=SETTINGS)
    assert again.status == 204 and not again.action, "a repeated ack is answered as the first, and not redone"
    conflict = c.decide(f'"{handout.tag}"', 1, acknowledge=False, now=4.0, settings=SETTINGS)
    assert conflict.status == 409


def test_an_ack_without_if_match_or_of_an_unknown_message_is_refused() -> None:
    c = consumer()
    assert c.decide(None, 1, acknowledge=True, now=0.0, settings=SETTINGS).status == 428
    assert c.decide('"x"', 1, acknowledge=True, now=0.0, settings=SETTINGS).status == 404


def test_a_repeat_past_the_replay_window_is_stale_whether_or_not_the_sweep_has_run() -> None:
    for swept in (False, True):
        c = consumer(ack_wait_s=30)
        c.offer(1, 0, b"one", attempt=1, now=0.0)
        handout = c.take(now=0.0, wall_s=0.0, serial="a")
        assert handout is not None
        assert c.decide(f'"{handout.tag}"', 1, acknowledge=True, now=1.0, settings=SETTINGS).action == "ack"
        c.settle(1, acknowledge=True, now=1.0)
        if swept:
            c.prune(now=62.0, window_s=SETTINGS.ack_replay_window_s)
        late = c.decide(f'"{handout.tag}"', 1, acknowledge=True, now=62.0, settings=SETTINGS)
        assert late.status == 412 and late.body is not None and late.body["state"] == "forgotten", swept
        assert c.decide(f'"{handout.tag}"', 2, acknowledge=True, now=62.0, settings=SETTINGS).status == 404
        other = pp.Consumer("c2", "orders", pp.ConsumerOptions(), "e0", now=0.0)
        assert other.decide(f'"{handout.tag}"', 1, acknowledge=True, now=62.0, settings=SETTINGS).status == 404


def test_past_its_ackwait_a_delivery_is_void_and_its_tag_stale() -> None:
    c = consumer(ack_wait_s=5)
    c.offer(7, 0, b"x", attempt=1, now=0.0)
    handout = c.take(now=0.0, wall_s=0.0, serial="a")
    assert handout is not None
    stale = c.decide(f'"{handout.tag}"', 7, acknowledge=True, now=6.0, settings=SETTINGS)
    assert stale.status == 412 and stale.body is not None and stale.body["state"] == "expired"
    c.offer(7, 0, b"x", attempt=2, now=6.0)  # the engine sends it again: ready ahead of newer ones
    c.offer(8, 0, b"y", attempt=1, now=6.0)
    again = c.take(now=6.0, wall_s=6.0, serial="b")
    assert again is not None and (again.seq, again.count) == (7, 2) and again.tag != handout.tag


def test_a_nack_makes_the_message_ready_again_first() -> None:
    c = consumer(max_inflight=5)
    for seq in (1, 2):
        c.offer(seq, 0, b"%d" % seq, attempt=1, now=0.0)
    first = c.take(now=0.0, wall_s=0.0, serial="a")
    assert first is not None and first.seq == 1
    assert c.decide(f'"{first.tag}"', 1, acknowledge=False, now=1.0, settings=SETTINGS).action == "nack"
    c.settle(1, acknowledge=False, now=1.0)
    nxt = c.take(now=1.0, wall_s=1.0, serial="b")
    assert nxt is not None and (nxt.seq, nxt.count) == (1, 2)


def test_a_retried_step_replays_its_delivery_while_it_is_current() -> None:
    c = consumer(ack_wait_s=5)
    c.offer(3, 0, b"z", attempt=1, now=0.0)
    handout = c.take(now=0.0, wall_s=0.0, serial="a")
    c.last = handout
    assert c.replayable(now=1.0) is handout
    assert c.replayable(now=5.0) is None, "its AckWait is over: a retry gets nothing stale"


def test_auto_ack_hands_out_without_a_tag_and_binds_nothing() -> None:
    c = consumer(ack_manual=False)
    c.offer(1, 0, b"x", attempt=1, now=0.0)
    handout = c.take(now=0.0, wall_s=0.0, serial="a")
    assert handout is not None and handout.tag == "" and c.window() == 0 and not c.full()


def test_a_queue_member_lends_its_waiting_message_and_the_group_settles_it() -> None:
    a, b = consumer(group="g"), consumer(group="g")
    a.offer(4, 0, b"x", attempt=1, now=0.0)
    lent = a.lend()
    assert lent is not None and lent.borrowed and not a.has_ready()
    handout = b.take(now=0.0, wall_s=0.0, serial="a", lent=lent)
    assert handout is not None and b.window() == 0, "the lender's engine subscription still holds it"


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("new", (StartPosition.NEW_ONLY, 0, 0)),
        ("first", (StartPosition.FIRST, 0, 0)),
        ("last", (StartPosition.LAST_RECEIVED, 0, 0)),
        ("seq:42", (StartPosition.SEQUENCE_START, 42, 0)),
        ("ago:1.5", (StartPosition.TIME_DELTA_START, 0, 1_500_000_000)),
        ("time:1970-01-01T00:00:01Z", (StartPosition.TIME_DELTA_START, 0, 9_000_000_000)),
    ],
)
def test_start_positions(text: str, start: tuple[StartPosition, int, int]) -> None:
    options = pp.parse_options({"start": text}, now_unix_ns=10_000_000_000)
    assert (options.start, options.start_sequence, options.start_time_delta_ns) == start


@given(
    st.dictionaries(
        st.sampled_from(["ack", "autoAck", "durable", "group", "start", "ack_wait", "max_inflight", "idle_timeout"]),
        st.text(max_size=20),
    )
)
def test_any_form_is_options_or_a_bad_parameter_naming_its_field(form: dict[str, str]) -> None:
    try:
        options = pp.parse_options(form, now_unix_ns=10**18)
    except pp.BadParameter as exc:
        assert exc.name in form
        return
    assert 1 <= options.max_inflight <= pp.MAX_INFLIGHT_CAP and options.ack_wait_s >= 1
    assert ":" not in options.durable and ":" not in options.group


@given(st.one_of(st.none(), st.text(max_size=12), st.floats().map(str)), st.booleans())
def test_any_delay_is_seconds_or_a_bad_parameter(value: str | None, acknowledge: bool) -> None:
    try:
        delay = pp.parse_delay(value, acknowledge)
    except pp.BadParameter as exc:
        assert exc.name == "delay"
        return
    assert 0 <= delay <= MAX_NAK_DELAY_S
    assert not acknowledge or delay == 0
