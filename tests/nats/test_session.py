"""The NATS session's decisions without a socket: what a CONNECT sets, which SUBs and PUBs are refused
and with which words, PINGs going unanswered."""

from __future__ import annotations

from streaming.nats.session import Session
from streaming.security.permissions import Permissions, Rule
from streaming.wire import nats as p


def test_a_verbose_connect_is_answered_ok_and_so_is_every_request_after_it() -> None:
    session = Session()
    assert session.ok() == b""
    assert session.connect(p.Connect({"verbose": True, "pedantic": True, "echo": False, "name": "app"})) == p.OK_BYTES
    assert session.ok() == p.OK_BYTES and session.pedantic and not session.echo and session.name == "app"


def test_a_sub_to_an_invalid_subject_or_queue_is_refused_as_nats_server_words_it() -> None:
    session = Session()
    for sub in (p.Sub("a..b", "", "1"), p.Sub("ok", "bad queue", "2")):
        refusal = session.subscription(sub, internal=False)
        assert refusal is not None and refusal.error == p.encode_err(p.INVALID_SUBJECT)
        assert refusal.kind == "invalid_subject"
    assert session.subscription(p.Sub("orders.>", "workers", "3"), internal=False) is None


def test_the_servers_own_subjects_and_denied_ones_are_a_permissions_violation() -> None:
    session = Session()
    refusal = session.subscription(p.Sub("_STAN.sub.x", "", "1"), internal=True)
    assert refusal is not None and refusal.kind == "permissions"
    assert refusal.error == p.encode_err(f'{p.PERMISSIONS_VIOLATION} for Subscription to "_STAN.sub.x"')
    session.permissions = Permissions(Rule(allow=("orders.>",)), Rule(allow=("orders.>",))).compiled()
    assert session.subscription(p.Sub("billing", "", "2"), internal=False) is not None
    assert session.subscription(p.Sub("orders.eu", "", "3"), internal=False) is None
    denied = session.publish_refusal("billing", internal=False)
    assert denied is not None and denied.error == p.encode_err(f'{p.PERMISSIONS_VIOLATION} for Publish to "billing"')
    assert session.publish_refusal("orders.eu", internal=False) is None
    assert session.publish_refusal("_STAN.pub.x", internal=True) is None, "the server's own subjects are the broker's"


def test_an_unsub_with_a_maximum_ends_the_subscription_once_it_is_reached() -> None:
    session = Session()
    assert session.unsubscribes_now(0, None)
    assert not session.unsubscribes_now(2, 5)
    assert session.unsubscribes_now(5, 5)


def test_pings_stop_after_too_many_go_unanswered_and_a_pong_resets_them() -> None:
    session = Session()
    assert session.ping(2) == p.PING_BYTES
    assert session.ping(2) == p.PING_BYTES
    assert session.ping(2) is None, "stale: the broker closes the connection"
    session.pong()
    assert session.ping(2) == p.PING_BYTES
