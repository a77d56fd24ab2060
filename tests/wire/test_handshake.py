"""The client side of a NATS connection's start, without a socket: TLS as the INFO and the options
say, the CONNECT's credentials (URL first, an nkey's signature of the nonce), the PONG or -ERR that
ends it, and which server comes next after a drop."""

from __future__ import annotations

import json
import ssl

import pytest

from streaming.wire import nats as p
from streaming.wire.handshake import Handshake, HandshakeError, HandshakeOptions, ServerList, resubscribe
from streaming.wire.urls import parse_url, parse_urls


def connect_options(handshake: Handshake) -> dict[str, object]:
    frame = handshake.connect()
    assert frame.endswith(b"\r\n" + p.PING_BYTES)
    options: dict[str, object] = json.loads(frame.split(b"CONNECT ", 1)[1].split(b"\r\n", 1)[0])
    return options


def test_credentials_in_the_url_win_over_the_options() -> None:
    options = HandshakeOptions(name="svc", user="opt", password="pw")
    with_url = Handshake(parse_url("nats://alice:secret@h:4222"), options)
    with_url.tls_for(p.Info({}))
    assert (connect_options(with_url)["user"], connect_options(with_url)["pass"]) == ("alice", "secret")
    token = Handshake(parse_url("nats://tok@h"), options)
    token.tls_for(p.Info({}))
    assert connect_options(token)["auth_token"] == "tok"
    plain = Handshake(parse_url("h"), options)
    plain.tls_for(p.Info({}))
    assert (connect_options(plain)["user"], connect_options(plain)["name"]) == ("opt", "svc")


def test_a_signer_signs_the_nonce_of_the_info_and_needs_one() -> None:
    options = HandshakeOptions(signer=lambda nonce: {"nkey": "UABC", "sig": f"signed:{nonce}"})
    handshake = Handshake(parse_url("h"), options)
    handshake.tls_for(p.Info({"nonce": "n0nce"}))
    assert connect_options(handshake)["sig"] == "signed:n0nce"
    bare = Handshake(parse_url("h"), options)
    bare.tls_for(p.Info({}))
    with pytest.raises(HandshakeError, match="no nonce"):
        bare.connect()


def test_tls_as_the_server_and_the_options_say() -> None:
    context = ssl.create_default_context()
    assert Handshake(parse_url("h"), HandshakeOptions()).tls_for(p.Info({})) is None
    assert Handshake(parse_url("h"), HandshakeOptions(tls=context)).tls_for(p.Info({"tls_required": True})) is context
    with pytest.raises(HandshakeError, match="does not offer it"):
        Handshake(parse_url("tls://h"), HandshakeOptions()).tls_for(p.Info({}))
    with pytest.raises(HandshakeError, match="the server requires TLS"):
        Handshake(parse_url("h"), HandshakeOptions()).tls_for(p.Info({"tls_required": True}))
    asked = Handshake(parse_url("h"), HandshakeOptions(tls_when_asked=True)).tls_for(p.Info({"tls_required": True}))
    assert isinstance(asked, ssl.SSLContext), "the server's link uses the system's CAs when asked"


def test_the_pong_ends_it_and_an_err_refuses_it() -> None:
    handshake = Handshake(parse_url("h"), HandshakeOptions())
    assert not handshake.done(p.Info({}))
    assert handshake.done(p.Pong())
    with pytest.raises(HandshakeError, match="Authorization Violation"):
        handshake.done(p.Err("Authorization Violation"))


def test_after_a_drop_the_next_server_then_the_others_and_what_the_cluster_names() -> None:
    servers = ServerList(parse_urls("nats://u:p@a:1,b:2"))
    a, b = servers.known
    assert servers.after(None) == [a, b]
    assert servers.after(a) == [b, a]
    assert servers.learn({"connect_urls": ["c:3", "a:1"]}, current=a)
    assert [str(u) for u in servers.known] == ["nats://a:1", "nats://b:2", "nats://c:3"]
    assert servers.known[2].user == "u", "a discovered node is reached with the credentials in use"
    assert not servers.learn({"connect_urls": ["a:1", "c:3"]}, current=a), "the same cluster: no change"
    assert servers.after(b) == [servers.known[2], a, b]


def test_a_reconnect_sends_every_subscription_again_with_its_sid() -> None:
    assert resubscribe([("1", "orders", ""), ("7", "jobs", "workers")]) == [
        p.encode_sub("orders", "1", ""),
        p.encode_sub("jobs", "7", "workers"),
    ]
