"""The lease's timing on each member's own clock (MockClock): a standby claims only after the holder's
revision stood still for the whole lease on its clock, and the active believes its lease over first."""

from __future__ import annotations

from trio.testing import MockClock

from streaming.ft.lease import LeaseClock, LeaseWatch


def test_a_lease_nobody_ever_held_may_be_claimed_at_once() -> None:
    assert LeaseWatch(2.0, MockClock().current_time).lapsed(None)


def test_a_standby_claims_only_after_a_revision_stood_still_for_the_whole_lease() -> None:
    clock = MockClock()
    watch = LeaseWatch(2.0, clock.current_time)
    assert not watch.lapsed(5)  # first seen now
    clock.jump(1.9)
    assert not watch.lapsed(5)
    clock.jump(0.1)
    assert watch.lapsed(5)


def test_a_renewal_starts_the_count_again() -> None:
    clock = MockClock()
    watch = LeaseWatch(2.0, clock.current_time)
    watch.lapsed(5)
    clock.jump(1.5)
    assert not watch.lapsed(6)  # renewed: a new revision
    clock.jump(1.5)
    assert not watch.lapsed(6)
    clock.jump(0.5)
    assert watch.lapsed(6)


def test_the_active_believes_its_lease_over_before_a_standby_believes_it_lapsed() -> None:
    """The active counts from when it sent the renewal, the standby from when it saw the result."""
    clock = MockClock()
    active, standby = LeaseClock(2.0, clock.current_time), LeaseWatch(2.0, clock.current_time)
    sent = clock.current_time()
    clock.jump(0.25)  # the renewal's round trip
    active.renewed(sent)
    standby.lapsed(7)  # the standby sees revision 7 only now
    clock.jump(1.75)
    assert active.left() <= 0 and not standby.lapsed(7)
    clock.jump(0.25)
    assert standby.lapsed(7)


def test_a_paused_active_finds_its_lease_over_when_it_runs_again() -> None:
    clock = MockClock()
    active = LeaseClock(2.0, clock.current_time)
    active.renewed(clock.current_time())
    assert active.left() == 2.0
    clock.jump(30)  # SIGSTOP ... SIGCONT
    assert active.left() < 0
