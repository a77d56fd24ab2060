"""NATS subjects: validation, and the subscription index that finds who gets a published message.

`*` matches one token, `>` one or more trailing tokens. Matches are cached per published
subject, because in this server the same few subjects (publish prefixes, inboxes, ack inboxes) carry
almost all the traffic; any subscription change empties the cache.
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


class Sublist(Generic[S]):
    """Subscriptions by subject. `match(subject)` returns (plain subscribers, one pick per queue group)."""

    def __init__(self) -> None:
        self._literal: dict[str, dict[S, str]] = {}  # subject -> {sub: queue}
        self._wild: dict[S, tuple[list[str], str]] = {}  # sub -> (pattern tokens, queue)
        self._subject: dict[S, str] = {}
        self._cache: dict[str, tuple[list[S], dict[str, list[S]]]] = {}

    def __len__(self) -> int:
        return len(self._subject)

    def add(self, sub: S, subject: str, queue: str = "") -> None:
        self._cache.clear()
        self._subject[sub] = subject
        if "*" in subject or ">" in subject:
            self._wild[sub] = (subject.split("."), queue)
        else:
            self._literal.setdefault(subject, {})[sub] = queue

    def remove(self, sub: S) -> None:
        subject = self._subject.pop(sub, None)
        if subject is None:
            return
        self._cache.clear()
        if self._wild.pop(sub, None) is None:
            subs = self._literal.get(subject)
            if subs is not None:
                subs.pop(sub, None)
                if not subs:
                    del self._literal[subject]

    def _lookup(self, subject: str) -> tuple[list[S], dict[str, list[S]]]:
        hit = self._cache.get(subject)
        if hit is not None:
            return hit
        plain: list[S] = []
        groups: dict[str, list[S]] = {}
        for sub, queue in self._literal.get(subject, {}).items():
            (groups.setdefault(queue, []) if queue else plain).append(sub)
        if self._wild:
            tokens = subject.split(".")
            for sub, (pattern, queue) in self._wild.items():
                if matches(pattern, tokens):
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
