"""NATS subjects: validation, and the subscription index that finds who gets a published message.

`*` matches one token, `>` one or more trailing tokens. Literal subscriptions are found in one dict;
wildcard ones in a tree of tokens (a level per token, with a branch for each literal token, one for
`*`, and the subscriptions ending in `>` at the level where `>` stands), so finding who gets a
message costs a step per token of its subject, not a test of every wildcard subscription: a
thousand clients each holding a wildcard inbox (`_INBOX.<id>.*`, as NATS clients subscribe for
replies) made that test most of the server's CPU. Matches are also cached per published subject,
because the same few subjects (publish prefixes, inboxes, ack inboxes) carry most of the traffic;
any subscription change empties the cache.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Generic, TypeVar

S = TypeVar("S", bound=Hashable)
_CACHE_LIMIT = 50_000


def _tokens_ok(tokens: list[str], *, wildcards: bool) -> bool:
    for i, token in enumerate(tokens):
        if not token or any(c in token for c in " \t\r\n"):
            return False
        if wildcards:
            if token == ">" and i != len(tokens) - 1:
                return False
            if token not in ("*", ">") and ("*" in token or ">" in token):
                return False
        elif "*" in token or ">" in token:
            return False
    return True


def valid_subject(subject: str) -> bool:
    """A subscription subject: wildcards allowed as whole tokens, `>` only last."""
    return bool(subject) and _tokens_ok(subject.split("."), wildcards=True)


def valid_literal(subject: str) -> bool:
    """A publish subject: no wildcards."""
    return bool(subject) and _tokens_ok(subject.split("."), wildcards=False)


def has_wildcard(subject: str) -> bool:
    """Whether `subject` has a wildcard token (`*` or `>`): it names a family of subjects, not one."""
    return any(token in ("*", ">") for token in subject.split("."))


def matches(pattern: list[str], tokens: list[str]) -> bool:
    if len(tokens) < len(pattern) or (len(tokens) > len(pattern) and pattern[-1] != ">"):
        return False
    for want, got in zip(pattern, tokens, strict=False):
        if want == ">":
            return True
        if want != "*" and want != got:
            return False
    return True


class _Level(Generic[S]):
    """One token's place in the tree of wildcard patterns."""

    __slots__ = ("literal", "rest", "star", "subs")

    def __init__(self) -> None:
        self.literal: dict[str, _Level[S]] = {}  # the next level after each literal token
        self.star: _Level[S] | None = None  # the next level after `*`
        self.rest: dict[S, str] = {}  # patterns with `>` here: {sub: queue}
        self.subs: dict[S, str] = {}  # patterns that end after this level's token: {sub: queue}

    def empty(self) -> bool:
        return not (self.literal or self.star or self.rest or self.subs)


class Sublist(Generic[S]):
    """Subscriptions by subject. `match(subject)` returns (plain subscribers, one pick per queue group)."""

    def __init__(self) -> None:
        self._literal: dict[str, dict[S, str]] = {}  # subject -> {sub: queue}
        self._root: _Level[S] = _Level()  # the wildcard patterns, token by token
        self._wild = 0  # how many wildcard subscriptions the tree holds
        self._subject: dict[S, str] = {}
        self._cache: dict[str, tuple[list[S], dict[str, list[S]]]] = {}

    def __len__(self) -> int:
        return len(self._subject)

    def add(self, sub: S, subject: str, queue: str = "") -> None:
        self.remove(sub)  # a subscription has one subject: adding it again moves it
        self._cache.clear()
        self._subject[sub] = subject
        if "*" in subject or ">" in subject:
            level = self._root
            tokens = subject.split(".")
            for token in tokens[:-1]:
                level = self._step(level, token)
            if tokens[-1] == ">":
                level.rest[sub] = queue
            else:
                self._step(level, tokens[-1]).subs[sub] = queue
            self._wild += 1
        else:
            self._literal.setdefault(subject, {})[sub] = queue

    @staticmethod
    def _step(level: _Level[S], token: str) -> _Level[S]:
        if token == "*":
            if level.star is None:
                level.star = _Level()
            return level.star
        found = level.literal.get(token)
        if found is None:
            found = level.literal[token] = _Level()
        return found

    def remove(self, sub: S) -> None:
        subject = self._subject.pop(sub, None)
        if subject is None:
            return
        self._cache.clear()
        if "*" in subject or ">" in subject:
            self._remove_wild(sub, subject.split("."))
            return
        subs = self._literal.get(subject)
        if subs is not None:
            subs.pop(sub, None)
            if not subs:
                del self._literal[subject]

    def _remove_wild(self, sub: S, tokens: list[str]) -> None:
        """Take `sub` out of the tree, and the levels it leaves empty (clients come and go, each with
        inboxes of its own: their levels must not stay)."""
        path: list[tuple[_Level[S], str]] = []  # (level, the token taken from it)
        level: _Level[S] | None = self._root
        for token in tokens[:-1] if tokens[-1] == ">" else tokens:
            assert level is not None
            path.append((level, token))
            level = level.star if token == "*" else level.literal.get(token)
            if level is None:
                return
        assert level is not None
        held = level.rest if tokens[-1] == ">" else level.subs
        if held.pop(sub, None) is None:
            return
        self._wild -= 1
        for parent, token in reversed(path):
            if not level.empty():
                break
            if token == "*":
                parent.star = None
            else:
                del parent.literal[token]
            level = parent

    def _wild_matches(self, subject: str) -> list[dict[S, str]]:
        """The wildcard subscriptions matching `subject`, as the tree's dicts that hold them."""
        found: list[dict[S, str]] = []
        levels = [self._root]
        for token in subject.split("."):
            following: list[_Level[S]] = []
            for level in levels:
                if level.rest:  # `>` here: this token and any after it
                    found.append(level.rest)
                step = level.literal.get(token)
                if step is not None:
                    following.append(step)
                if level.star is not None:
                    following.append(level.star)
            if not following:
                return found
            levels = following
        found += [level.subs for level in levels if level.subs]
        return found

    def _lookup(self, subject: str) -> tuple[list[S], dict[str, list[S]]]:
        hit = self._cache.get(subject)
        if hit is not None:
            return hit
        plain: list[S] = []
        groups: dict[str, list[S]] = {}
        for sub, queue in self._literal.get(subject, {}).items():
            (groups.setdefault(queue, []) if queue else plain).append(sub)
        if self._wild:
            for held in self._wild_matches(subject):
                for sub, queue in held.items():
                    (groups.setdefault(queue, []) if queue else plain).append(sub)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[subject] = hit = (plain, groups)
        return hit

    def match(self, subject: str) -> list[S]:
        """Everyone who gets a message on `subject`: every plain subscriber, one member per queue group."""
        plain, groups = self._lookup(subject)
        if not groups:
            return plain
        return plain + [random.choice(members) for members in groups.values()]

    def has_interest(self, subject: str) -> bool:
        plain, groups = self._lookup(subject)
        return bool(plain or groups)
