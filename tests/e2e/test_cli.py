"""The `streaming-server` and `streaming` commands as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streaming.cli.server import _overrides, _server_parser
from streaming.config import ConfigError, load
from tests.support.servers import ServerProcess, command, server_process


def streaming(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return command("client_main", *args, stdin=stdin, timeout=60)


def test_pub_and_sub_commands(tmp_path: Path) -> None:
    with server_process("--dir", str(tmp_path / "data"), "--allow_ms_ack_wait") as server:
        where = f"127.0.0.1:{server.port}"
        done = streaming("-s", where, "pub", "greetings", "hello", "world")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[:2] == [
            f"published {text!r} to 'greetings' (guid {guid})"
            for text, guid in zip(["hello", "world"], guid_of(done.stdout), strict=True)
        ]
        assert done.stdout.splitlines()[2].startswith("published 2 messages to 'greetings' in ")
        done = streaming(
            "-s", where, "-id", "tester", "sub", "greetings", "--all", "--count", "2", "--durable", "d", "--manual_ack"
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "[#1] redelivered=false attempt=1: hello",
            "[#2] redelivered=false attempt=1: world",
        ]
        done = streaming("-s", where, "pub", "greetings", stdin="from stdin\n")
        assert done.returncode == 0 and "from stdin" in done.stdout
        # The durable (its key includes the client ID) resumes where it stopped.
        done = streaming(
            "-s", where, "-id", "tester", "sub", "greetings", "--count", "1", "--durable", "d", "--unsubscribe"
        )
        assert done.stdout.splitlines() == ["[#3] redelivered=false attempt=1: from stdin"]


def guid_of(out: str) -> list[str]:
    return [line.rsplit("(guid ", 1)[1].rstrip(")") for line in out.splitlines() if "(guid " in line]


def test_connection_options_go_before_or_after_the_subcommand(tmp_path: Path) -> None:
    with server_process("--store", "memory", "-cid", "prod") as server:
        where = f"127.0.0.1:{server.port}"
        after = streaming("pub", "-s", where, "-c", "prod", "orders", "a")
        before = streaming("-s", where, "-c", "prod", "pub", "orders", "b")
        mixed = streaming("-c", "prod", "pub", "orders", "c", "-s", where)
        assert [d.returncode for d in (after, before, mixed)] == [0, 0, 0], (after.stderr, mixed.stderr)
        got = streaming("sub", "orders", "--all", "--count", "3", "--server", where, "--cluster_id", "prod")
        assert [line.rsplit(": ", 1)[1] for line in got.stdout.splitlines()] == ["a", "b", "c"]


def test_pub_reads_stdin_and_reports_its_rate(tmp_path: Path) -> None:
    with server_process("--store", "memory") as server:
        lines = "".join(f"m{i}\n" for i in range(3000))
        done = streaming("pub", "-s", f"127.0.0.1:{server.port}", "-q", "bulk", stdin=lines)
        assert done.returncode == 0, done.stderr
        (summary,) = done.stdout.splitlines()
        assert summary.startswith("published 3000 messages to 'bulk' in ") and summary.endswith(" msgs/s")
        got = streaming("sub", "-s", f"127.0.0.1:{server.port}", "bulk", "--seq", "3000", "--count", "1")
        assert got.stdout.splitlines() == ["[#3000] redelivered=false attempt=1: m2999"]


def test_wrong_cluster_id_is_one_clear_line(tmp_path: Path) -> None:
    with server_process("--store", "memory") as server:
        done = streaming("pub", "-s", f"127.0.0.1:{server.port}", "-c", "nope", "--connect_timeout", "0.5s", "x", "y")
        assert done.returncode == 1
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("streaming: ") and "cluster ID" in line


def test_sub_extensions_dead_letters_and_backoff(tmp_path: Path) -> None:
    """--max_deliver with a dead-letter channel, and --backoff between the attempts."""
    with server_process("--store", "memory") as server:
        where = f"127.0.0.1:{server.port}"
        assert streaming("pub", "-s", where, "jobs", "poison").returncode == 0
        argv = ["sub", "-s", where, "jobs", "--all", "--manual_ack", "--no_ack", "--max_deliver", "2"]
        argv += ["--dead_letter", "jobs.failed", "--backoff", "0.3s,1s"]
        started = time.monotonic()
        entry = "from streaming.cli import client_main; raise SystemExit(client_main())"
        with subprocess.Popen([sys.executable, "-c", entry, *argv], stdout=subprocess.PIPE, text=True) as sub:
            try:
                # The dead letter comes after the second attempt's backoff (1 s), while `sub` still runs.
                letter = streaming("sub", "-s", where, "jobs.failed", "--all", "--count", "1")
            finally:
                sub.terminate()
            out, _ = sub.communicate(timeout=30)
        assert time.monotonic() - started < 10, "backoff delays, not the 30 s AckWait"
        assert [line.split(":")[0] for line in out.splitlines()] == [
            "[#1] redelivered=false attempt=1",
            "[#1] redelivered=true attempt=2",
        ]
        body = json.loads(letter.stdout.split(": ", 1)[1])
        assert (body["channel"], body["seq"], body["attempts"]) == ("jobs", 1, 2)


def test_sub_ack_progress_works_on_a_slow_message(tmp_path: Path) -> None:
    """A handler three AckWaits long, telling the server it is still at work (the engine's tests show
    that this keeps the message from redelivery; here: the command does it and ends cleanly)."""
    with server_process("--store", "memory", "--allow_ms_ack_wait") as server:
        where = f"127.0.0.1:{server.port}"
        assert streaming("pub", "-s", where, "slow", "work").returncode == 0
        done = streaming(
            "sub", "-s", where, "slow", "--all", "--count", "1", "--manual_ack", "--ack_wait", "0.4s",
            "--ack_delay", "1.2s", "--ack_progress", "--max_inflight_redeliveries",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["[#1] redelivered=false attempt=1: work"]
        refused = streaming("sub", "-s", where, "slow", "--ack_progress")
        assert refused.returncode == 2 and "--ack_progress needs --manual_ack" in refused.stderr


def test_sub_nak_gives_each_message_back_once(tmp_path: Path) -> None:
    with server_process("--store", "memory") as server:
        where = f"127.0.0.1:{server.port}"
        assert streaming("pub", "-s", where, "jobs", "a", "b").returncode == 0
        started = time.monotonic()
        done = streaming("sub", "-s", where, "jobs", "--all", "--count", "4", "--manual_ack", "--nak", "0.5s")
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started >= 0.5
        assert done.stdout.splitlines() == [
            "[#1] redelivered=false attempt=1: a",
            "[#2] redelivered=false attempt=1: b",
            "[#1] redelivered=true attempt=2: a",
            "[#2] redelivered=true attempt=2: b",
        ]
        refused = streaming("sub", "-s", where, "jobs", "--nak", "1s")
        assert refused.returncode == 2 and "--nak needs --manual_ack" in refused.stderr


def test_server_help_groups_its_flags() -> None:
    text = _server_parser().format_help()
    for group in ("network:", "store:", "limits", "heartbeats:", "monitoring:", "logging:"):
        assert group in text


def test_sub_without_ack_shows_redeliveries(tmp_path: Path) -> None:
    with server_process("--store", "memory") as server:
        where = f"127.0.0.1:{server.port}"
        assert streaming("-s", where, "pub", "jobs", "job-1").returncode == 0
        done = streaming(
            "-s", where, "sub", "jobs", "--all", "--count", "3", "--manual_ack", "--no_ack", "--ack_wait", "1s"
        )
        assert done.stdout.splitlines() == [
            "[#1] redelivered=false attempt=1: job-1",
            "[#1] redelivered=true attempt=2: job-1",
            "[#1] redelivered=true attempt=3: job-1",
        ]


def test_client_reports_unreachable_server() -> None:
    done = streaming("-s", "127.0.0.1:1", "pub", "x", "y")
    assert done.returncode == 1 and "cannot connect" in done.stderr


def test_server_shuts_down_cleanly_on_sigterm(tmp_path: Path) -> None:
    server = ServerProcess(["-p", "0", "--dir", str(tmp_path / "data")]).start()
    assert server.stop() == 0
    assert any("server stopped" in line for line in server.log)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("prot = 4222\n", "extra fields found (prot) @ config"),
        ("[limits]\nmax_agee = '1h'\n", "extra fields found (max_agee) @ config.limits"),
        ("[channels.'orders.*']\nmax_msg = 5\n", "extra fields found (max_msg) @ config.channels['orders.*']"),
        ("hb_interval = 'soon'\n", "@ config.hb_interval"),
        ("port = 'x'\n", "@ config.port"),
        ("store = 'sql'\n", "store: expected 'lmdb' or 'memory'"),
        ("[limits]\nmax_msgs = -1\n", "global limit max_msgs must be >= 0"),
        ("port = \n", "invalid TOML"),
        ("file_sync = 'maybe'\n", "expected true or false, got 'maybe' @ config.file_sync"),
        ("file_sync = false\nsync_interval = 0\n", "sync_interval must be positive"),
        ("partitioning = true\n", "partitioning needs nats_server"),
        ("nats_server = 'h'\npartitioning = true\n", "partitioning needs the channels this server owns"),
        ("nats_server = 'http://h'\n", "nats_server: 'http://h': a NATS server URL starts with nats:// or tls://"),
        ("nats_server = 'h'\nnats_user = 'u'\n", "nats_user and nats_password go together"),
        ("nats_server = 'h'\nhash_partition = '1/2'\nhttp_api_port = 8080\n", "the HTTP doors (Bayeux, pull) are not"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    done = subprocess.run(
        [sys.executable, "-m", "streaming", "-c", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert message in done.stderr and str(path) in done.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--nats_nkey_seed", "/no/such.nk"], "nats_nkey_seed: cannot read /no/such.nk"),
        (["--tls_client_cacert", "/no/ca.pem"], "cannot load the TLS client certificate files"),
    ],
)
def test_unusable_files_for_the_nats_cluster_stop_the_start(flags: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streaming", "-ns", "nats://127.0.0.1:1", *flags],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_config_file_with_flag_overrides(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text(
        "cluster_id = 'prod'\nport = 4333\nhb_interval = '1m30s'\nmax_payload = '2MB'\n"
        "[limits]\nmax_age = '24h'\nmax_msgs = 500\n"
        "[channels.'orders.>']\nmax_msgs = -1\n"
    )
    config = load(path, {"port": 0, "max_msgs": 10})
    assert (config.cluster_id, config.port, config.hb_interval, config.max_payload) == ("prod", 0, 90.0, 2_000_000)
    limits = config.store_limits()
    assert limits.channel.max_msgs == 10 and limits.channel.max_age_s == 86400
    assert limits.for_channel("orders.eu").max_msgs == 0  # negative per channel = unlimited
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("argv", "toml", "expected"),
    [
        ([], "", (True, 1.0)),  # every commit fsynced unless asked otherwise
        (["--file_sync=false"], "", (False, 1.0)),  # written as nats-streaming-server users write it
        (["--file_sync", "0", "--sync_interval", "250ms"], "", (False, 0.25)),
        ([], "file_sync = false\nsync_interval = '2m'\n", (False, 120.0)),
        (["--file_sync=true"], "file_sync = false\n", (True, 1.0)),  # the flag wins over the file
    ],
)
def test_file_sync_from_flags_and_file(
    tmp_path: Path, argv: list[str], toml: str, expected: tuple[bool, float]
) -> None:
    path = tmp_path / "server.toml"
    path.write_text(toml)
    args = _server_parser().parse_args(["-c", str(path), *argv])
    config = load(path, _overrides(args))
    assert (config.file_sync, config.sync_interval) == expected


def test_bad_file_sync_flag_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streaming", "--file_sync=sometimes"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "--file_sync" in done.stderr and "sometimes" in done.stderr


def test_data_directory_in_use_is_refused(tmp_path: Path) -> None:
    with server_process("--dir", str(tmp_path / "data")):
        done = subprocess.run(
            [sys.executable, "-m", "streaming", "-p", "0", "--dir", str(tmp_path / "data")],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 1 and "in use by another process" in done.stderr


def test_allowed_origins_from_a_flag_and_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('http_api_allow_origins = ["https://a.example"]\n')
    assert load(path, {}).http_api_allow_origins == ["https://a.example"]
    args = _server_parser().parse_args(
        ["-c", str(path), "--http_api_allow_origins", "https://b.example, http://c:8000"]
    )
    assert load(path, _overrides(args)).http_api_allow_origins == ["https://b.example", "http://c:8000"]
    path.write_text('http_api_allow_origins = ["https://a.example/app"]\n')
    with pytest.raises(ConfigError, match=r"http_api_allow_origins.*path"):
        load(path, {})


def test_sub_to_a_pattern_names_each_messages_channel(tmp_path: Path) -> None:
    with server_process("--store", "memory") as server:
        where = f"127.0.0.1:{server.port}"
        for channel, text in (("orders.eu", "a"), ("orders.us", "b"), ("orders.eu", "c"), ("invoices.eu", "x")):
            assert streaming("pub", "-s", where, channel, text).returncode == 0
        done = streaming("sub", "-s", where, "orders.*", "--all", "--count", "3", "--manual_ack")
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.splitlines()) == [
            "[orders.eu #1] redelivered=false attempt=1: a",
            "[orders.eu #2] redelivered=false attempt=1: c",
            "[orders.us #1] redelivered=false attempt=1: b",
        ]
