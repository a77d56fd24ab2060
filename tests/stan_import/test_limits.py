"""The limits of a nats-streaming-server config file (`--stan_config`): read from its format, and applied
at import as that server applies them when it starts on its store."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import LmdbStore
from streaming.config import load
from streaming.stan_import.limits import StanConfigError, load_retention
from streaming.stan_import.natsconf import ConfFormatError, parse_duration_s, parse_file
from tests.stan_import.support import STORES, import_stan, manifest


def test_the_config_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIG", "2GB")
    (tmp_path / "more.conf").write_text("extra = yes\n")
    (tmp_path / "stan.conf").write_text(
        """
        # nats-server options, then the streaming section
        port: 4222
        limit = 10k
        streaming {
          id: "test-cluster"   // a comment
          store_limits: {
            max_channels = 5
            max_msgs: $limit
            max_bytes $BIG
            max_age: "1h30m"
            channels {
              "orders.*": { max_msgs: 0, max_age: "10s" }
              audit { max_bytes: 1MB }
              'x.>': {}
            }
          }
          list: [1, "two", three]
        }
        include "more.conf"
        """
    )
    tree = parse_file(tmp_path / "stan.conf")
    assert tree["limit"] == 10_000 and tree["extra"] is True
    section = tree["streaming"]
    assert section["list"] == [1, "two", "three"]
    assert section["store_limits"]["max_bytes"] == 2 * 1024**3
    limits = load_retention(tmp_path / "stan.conf").limits
    assert limits.max_channels == 5
    assert limits.channel.max_msgs == 10_000 and limits.channel.max_age_s == 5400
    orders = limits.for_channel("orders.eu")
    assert orders.max_msgs == 0 and orders.max_age_s == 10  # 0 in a channel's entry: unlimited
    assert limits.for_channel("audit").max_bytes == 1024 * 1024
    assert limits.for_channel("x.y.z").max_msgs == 10_000  # inherited


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("streaming { store_limits { max_msgs: 1 }", "a map is not closed"),
        ("a: $nowhere", r"line 1: variable \$nowhere is not defined"),
        ('a: "open', "a quoted string is not closed"),
    ],
)
def test_bad_config_text_names_its_line(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "c.conf").write_text(text)
    with pytest.raises(ConfFormatError, match=why):
        parse_file(tmp_path / "c.conf")


def test_bad_limits_are_refused(tmp_path: Path) -> None:
    (tmp_path / "c.conf").write_text("store_limits { max_age: 5 }")
    with pytest.raises(StanConfigError, match="max_age must be a duration"):
        load_retention(tmp_path / "c.conf")
    assert parse_duration_s("1h2m3.5s") == 3723.5
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_s("1 hour")
    done = import_stan(STORES / "basic", tmp_path / "data", "--stan_config", str(tmp_path / "c.conf"))
    assert done.returncode == 2 and "max_age must be a duration" in done.stderr and not (tmp_path / "data").exists()


def test_limits_remove_what_the_server_would_at_start(tmp_path: Path) -> None:
    (tmp_path / "stan.conf").write_text(
        'streaming { store_limits { channels { "orders.eu": { max_msgs: 100 }, "x.*.z": { max_age: "1s" } } } }'
    )
    done = import_stan(STORES / "basic", tmp_path / "data", "--stan_config", str(tmp_path / "stan.conf"))
    assert done.returncode == 0, done.stderr
    assert "channel 'orders.eu': the oldest 153 messages left out: over max_msgs 100" in done.stdout
    assert "channel 'x.y.z': the oldest 246 messages left out: older than max_age 1 s" in done.stdout
    # c1's durable had 40..51 pending: all below the new first sequence, so gone.
    assert "durable 'd1' of client 'c1' had 10 pending messages that are gone" in done.stdout
    with LmdbStore(tmp_path / "data") as store:
        orders, xyz = store.channel_info("orders.eu"), store.channel_info("x.y.z")
        assert orders is not None and (orders.first_seq, orders.last_seq, orders.msgs) == (154, 253, 100)
        assert xyz is not None and (xyz.first_seq, xyz.last_seq, xyz.msgs) == (247, 246, 0)  # last kept
        audit = store.channel_info("audit")
        held = {c["name"]: len(c["messages"]) for c in manifest("basic")["channels"]}
        assert audit is not None and audit.msgs == held["audit"]  # global limits: the server's defaults


def test_without_a_stan_config_it_names_what_our_limits_would_trim(tmp_path: Path) -> None:
    (tmp_path / "ours.toml").write_text('dir = "unused"\n[limits]\nmax_msgs = 1000\n')
    done = import_stan(STORES / "large", tmp_path / "data", "-c", str(tmp_path / "ours.toml"))
    assert done.returncode == 0, done.stderr
    assert "channel 'large.ch00': 4000 messages, over max_msgs 1000: the server's limits will trim it" in done.stdout
    with LmdbStore(tmp_path / "data") as store:
        info = store.channel_info("large.ch00")
        assert info is not None and info.msgs == 4000  # imported whole: the limits are the server's to apply


def test_the_stan_limits_are_given_as_our_config(tmp_path: Path) -> None:
    """What the importer prints for this server's config file resolves as the STAN file's limits did."""
    (tmp_path / "stan.conf").write_text(
        'store_limits { max_channels: 7, max_msgs: 500, max_age: "2h", '
        'channels { "orders.*": { max_msgs: 0, max_bytes: 10KB }, audit: { max_inactivity: "1m" } } }'
    )
    done = import_stan(STORES / "basic", tmp_path / "data", "--stan_config", str(tmp_path / "stan.conf"))
    assert done.returncode == 0, done.stderr
    toml = done.stdout.split("in this server's config file (-c):\n", 1)[1]
    (tmp_path / "ours.toml").write_text(toml)
    ours = load(str(tmp_path / "ours.toml"), {}).store_limits()
    theirs = load_retention(tmp_path / "stan.conf").limits
    assert ours.max_channels == 7 == theirs.max_channels
    for name in ("orders.eu", "audit", "x.y.z", "other"):
        assert ours.for_channel(name) == theirs.for_channel(name), name
