"""Limit resolution (globals, literal and wildcard overrides, inherit and unlimited) and eviction planning."""

from __future__ import annotations

import pytest

from storage import ChannelLimits, StoreLimits
from storage.limits import pattern_matches, plan_eviction


def test_defaults_match_nats_streaming() -> None:
    limits = StoreLimits()
    assert (limits.max_channels, limits.max_subs) == (100, 1000)
    assert limits.for_channel("any") == ChannelLimits(max_msgs=1_000_000, max_bytes=1_024_000_000, max_age_s=0)


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("foo", "foo", True),
        ("foo", "foo.bar", False),
        ("foo.*", "foo.bar", True),
        ("foo.*", "foo", False),
        ("foo.*", "foo.bar.baz", False),
        ("foo.>", "foo.bar.baz", True),
        ("foo.>", "foo", False),
        (">", "anything.at.all", True),
        ("*.bar", "foo.bar", True),
    ],
)
def test_pattern_matching(pattern: str, name: str, matches: bool) -> None:
    assert pattern_matches(pattern, name) is matches


def test_closest_entry_wins_zero_inherits_negative_is_unlimited() -> None:
    limits = StoreLimits(
        channel=ChannelLimits(max_msgs=100, max_bytes=1000, max_age_s=60),
        per_channel={
            ">": ChannelLimits(max_age_s=10),
            "foo.>": ChannelLimits(max_msgs=50),
            "foo.*": ChannelLimits(max_msgs=40, max_bytes=-1),
            "foo.bar": ChannelLimits(max_msgs=-1),
        },
    )
    assert limits.for_channel("foo.bar") == ChannelLimits(max_msgs=0, max_bytes=0, max_age_s=10)
    assert limits.for_channel("foo.baz") == ChannelLimits(max_msgs=40, max_bytes=0, max_age_s=10)
    assert limits.for_channel("foo.baz.qux") == ChannelLimits(max_msgs=50, max_bytes=1000, max_age_s=10)
    assert limits.for_channel("other") == ChannelLimits(max_msgs=100, max_bytes=1000, max_age_s=10)


@pytest.mark.parametrize("field", ["max_msgs", "max_bytes", "max_age_s"])
def test_negative_global_limits_are_a_configuration_error(field: str) -> None:
    with pytest.raises(ValueError, match=f"global limit {field} must be >= 0"):
        StoreLimits(channel=ChannelLimits(**{field: -1}))


@pytest.mark.parametrize("pattern", ["", "foo..bar", "foo.>.bar", "foo*", ".foo"])
def test_bad_per_channel_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="per-channel limit"):
        StoreLimits(per_channel={pattern: ChannelLimits(max_msgs=1)})


def test_plan_eviction_reads_only_as_far_as_needed() -> None:
    consumed = []

    def oldest() -> object:
        for i in range(1, 1_000_000):
            consumed.append(i)
            yield (10, i)

    count, freed = plan_eviction(ChannelLimits(max_msgs=5), 8, 80, oldest(), now_unix_ns=0)  # type: ignore[arg-type]
    assert (count, freed) == (3, 30)
    assert consumed == [1, 2, 3, 4]
