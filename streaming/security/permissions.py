"""Per-user publish and subscribe permissions, in nats-server's shape: for each, subjects allowed (none
listed: all) and subjects denied, wildcards included.

- A publish is allowed when an allow pattern matches its subject and no deny pattern does.
- A subscription is allowed when an allow pattern covers every subject it could match and no deny
  pattern covers it. One that merely overlaps a deny pattern (`>` with `secret.>` denied) is
  allowed, but is not given messages on denied subjects (`Permissions.may_receive`).

The same rules apply to STAN channels: a STAN publish or subscription is checked against its channel,
the server's own request subjects are not (they are how the protocol works).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from streaming.wire.subjects import matches, valid_subject

Pattern = list[str]


@attrs.frozen
class Rule:
    allow: tuple[str, ...] = ()  # empty: every subject
    deny: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        for subject in (*self.allow, *self.deny):
            if not valid_subject(subject):
                raise ValueError(f"permission subject {subject!r} is not a valid subject")


@attrs.frozen
class Permissions:
    publish: Rule = attrs.Factory(Rule)
    subscribe: Rule = attrs.Factory(Rule)

    def compiled(self) -> Compiled:
        return Compiled(self)


class Compiled:
    """Permissions with their patterns split into tokens once."""

    def __init__(self, permissions: Permissions) -> None:
        split = _split
        self.pub_allow, self.pub_deny = split(permissions.publish.allow), split(permissions.publish.deny)
        self.sub_allow, self.sub_deny = split(permissions.subscribe.allow), split(permissions.subscribe.deny)

    def may_publish(self, subject: str) -> bool:
        tokens = subject.split(".")
        if self.pub_allow and not any(matches(p, tokens) for p in self.pub_allow):
            return False
        return not any(matches(p, tokens) for p in self.pub_deny)

    def may_subscribe(self, subject: str) -> bool:
        tokens = subject.split(".")
        if self.sub_allow and not any(covers(p, tokens) for p in self.sub_allow):
            return False
        return not any(covers(p, tokens) for p in self.sub_deny)

    def filters(self, subject: str) -> bool:
        """Whether a subscription to `subject` could match a denied subject (its messages are then
        checked one by one with `may_receive`)."""
        tokens = subject.split(".")
        return any(overlap(p, tokens) for p in self.sub_deny)

    def denied_within(self, subject: str) -> tuple[str, ...]:
        """The denied patterns that part of what `subject` matches falls under (a wildcard
        subscription must leave their channels out)."""
        tokens = subject.split(".")
        return tuple(".".join(p) for p in self.sub_deny if overlap(p, tokens))

    def may_receive(self, subject: str) -> bool:
        tokens = subject.split(".")
        return not any(matches(p, tokens) for p in self.sub_deny)


def _split(subjects: Sequence[str]) -> list[Pattern]:
    return [s.split(".") for s in subjects]


def covers(pattern: Pattern, subject: Pattern) -> bool:
    """Whether every subject `subject` (wildcards allowed) matches also matches `pattern`."""
    for i, want in enumerate(pattern):
        if want == ">":
            return i < len(subject)
        if i >= len(subject):
            return False
        got = subject[i]
        if got == ">" or (want != "*" and (got == "*" or got != want)):
            return False
    return len(subject) == len(pattern)


def overlap(a: Pattern, b: Pattern) -> bool:
    """Whether some subject matches both patterns."""
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != "*" and y != "*" and x != y:
            return False
    return True
