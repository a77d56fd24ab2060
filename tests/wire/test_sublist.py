"""The subscription index finds exactly the subscriptions whose subject matches a published one,
whatever was added and removed before, and keeps nothing of the wildcard patterns that are gone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.wire.subjects import Sublist, matches

_TOKENS = st.sampled_from(["a", "b", "c"])
_PATTERN_TOKENS = st.sampled_from(["a", "b", "c", "*"])


@st.composite
def _patterns(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(_PATTERN_TOKENS, min_size=0, max_size=3))
    if draw(st.booleans()) or not tokens:
        tokens.append(draw(st.sampled_from(["a", "*", ">"])))
    return ".".join(tokens)


_SUBJECTS = st.lists(_TOKENS, min_size=1, max_size=5).map(".".join)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 7), _patterns(), st.sampled_from(["", "q1", "q2"])),
        st.tuples(st.just("remove"), st.integers(0, 7)),
        st.tuples(st.just("match"), _SUBJECTS),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_the_index_matches_as_each_pattern_does(ops: list[tuple[object, ...]]) -> None:
    index: Sublist[int] = Sublist()
    held: dict[int, tuple[str, str]] = {}  # sub -> (subject, queue): what a plain scan would test
    for op in ops:
        if op[0] == "add":
            _, sub, subject, queue = op
            assert isinstance(sub, int) and isinstance(subject, str) and isinstance(queue, str)
            index.add(sub, subject, queue)
            held[sub] = (subject, queue)
        elif op[0] == "remove":
            assert isinstance(op[1], int)
            index.remove(op[1])
            held.pop(op[1], None)
        else:
            subject = op[1]
            assert isinstance(subject, str)
            tokens = subject.split(".")
            wanted = {sub for sub, (pattern, _) in held.items() if matches(pattern.split("."), tokens)}
            got = index.match(subject)
            assert len(got) == len(set(got)), "a subscription got the message twice"
            plain = {sub for sub in wanted if not held[sub][1]}
            groups = {held[sub][1] for sub in wanted if held[sub][1]}
            assert plain <= set(got) <= wanted, (subject, held)
            assert sorted(held[sub][1] for sub in got if held[sub][1]) == sorted(groups), "one per queue group"
            assert index.has_interest(subject) is bool(wanted)
    assert len(index) == len(held)
    for sub in list(held):
        index.remove(sub)
    assert index._root.empty() and not index._wild, "levels left behind by removed patterns"


def test_a_thousand_wildcard_inboxes_leave_nothing_behind() -> None:
    index: Sublist[int] = Sublist()
    for client in range(1000):
        index.add(client, f"_INBOX.{client:06d}.*")
    assert index.match("_INBOX.000042.7") == [42] and index.match("_INBOX.000042") == []
    for client in range(1000):
        index.remove(client)
    assert index._root.empty()
