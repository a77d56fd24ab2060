"""Damaged, truncated, emptied and deleted files under a real server, killed mid-run: the server either
serves every acknowledged message, or refuses to start (or, when its full check finds the damage while
it serves, stops) with one line that names the damaged file and the way forward, and then
`streaming-server repair` keeps everything intact and reports exactly which messages are lost. Never
silent loss, never a crash (SIGBUS) instead of an answer.

One store is made once (messages in LMDB and in the journal, a durable subscriber that has been sent
them all and acked some, large messages on overflow pages) and copied for each case.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from storage import ChannelLimits, LmdbStore, StoreLimits
from streaming.client import StartPosition, connect
from tests.faults.clients import CID, number, payload, publish, read_channel
from tests.support.servers import ServerProcess, command, free_port, state_stored, wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
Damage = Callable[[Path], str]  # damages a copy of the store; returns the file it damaged (relative)


async def _make_store(directory: Path) -> set[int]:
    """A store as a SIGKILL leaves it; returns the numbers of the acknowledged messages."""
    port = free_port()
    server = ServerProcess(["-p", str(port), "--http_port=-1", "--dir", str(directory)]).start()
    acked: set[int] = set()
    try:
        async with connect(CID, "audit", port=port) as sc:
            sub = await sc.open_subscription("orders", durable="audit", manual_ack=True, max_inflight=10_000)
            await publish(port, "orders", 0, 400, acked)
            await publish(port, "big", 0, 12, set())
            async with connect(CID, "big-pub", port=port) as big:
                for i in range(8):
                    await big.publish("big", b"%d:" % (1000 + i) + b"B" * 9000)  # overflow pages
            got = [await sub.next_msg() for _ in range(400)]
            for msg in got[:150]:
                msg.ack()
            await trio.sleep(1.5)  # a checkpoint: these are in LMDB now
            await publish(port, "orders", 400, 300, acked)  # these in the journal
            got = [await sub.next_msg() for _ in range(300)]
            await state_stored(server.http_port)  # the subscriber's position reaches the state file
            server.kill()
    finally:
        server.stop()
    return acked


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, frozenset[int]]:
    directory = tmp_path_factory.mktemp("pristine") / "data"
    acked = trio.run(_make_store, directory)
    return directory, frozenset(acked)


# -- ways to damage a store ------------------------------------------------------------------------


def flip(relative: str, at: Callable[[bytes], int] | int, count: int = 1) -> Damage:
    def damage(directory: Path) -> str:
        path = directory / relative
        raw = bytearray(path.read_bytes())
        start = at if isinstance(at, int) else at(bytes(raw))
        for i in range(start, min(start + count, len(raw))):
            raw[i] ^= 0xA5
        path.write_bytes(bytes(raw))
        return relative

    return damage


def every_copy(relative: str, marker: bytes, offset: int, count: int = 1) -> Damage:
    """Flip bytes in every copy of a message in a file: LMDB writes pages anew (copy on write) and
    freed pages keep old copies, so the live one is among them."""

    def damage(directory: Path) -> str:
        path = directory / relative
        raw = bytearray(path.read_bytes())
        at = raw.find(marker)
        assert at >= 0
        while at >= 0:
            for i in range(at + offset, at + offset + count):
                raw[i] ^= 0xA5
            at = raw.find(marker, at + 1)
        path.write_bytes(bytes(raw))
        return relative

    return damage


def in_journal_record(marker: bytes) -> Damage:
    """A flipped byte inside the journal record that holds a message."""

    def damage(directory: Path) -> str:
        for name in ("msgs/journal.0", "msgs/journal.1"):
            if marker in (directory / name).read_bytes():
                return flip(name, lambda raw: raw.index(marker) + 2)(directory)
        raise AssertionError(f"{marker!r} is in no journal file")

    return damage


def truncate(relative: str) -> Damage:
    def damage(directory: Path) -> str:
        path = directory / relative
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return relative

    return damage


def empty(relative: str) -> Damage:
    def damage(directory: Path) -> str:
        (directory / relative).write_bytes(b"")
        return relative

    return damage


def delete(relative: str) -> Damage:
    def damage(directory: Path) -> str:
        target = directory / relative
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        return relative

    return damage


def _random_flips(relative: str, seed: int, count: int) -> list[Damage]:
    """Bytes flipped anywhere past the two meta pages."""
    rng = random.Random(seed)

    def at(fraction: float) -> Damage:
        return flip(relative, lambda raw: 8192 + int(fraction * (len(raw) - 8192)))

    return [at(rng.random()) for _ in range(count)]


def _random_journal_flips(seed: int, count: int) -> list[Damage]:
    """Bytes flipped among the records of the journal file that holds the newest messages."""
    rng = random.Random(seed)

    def at(fraction: float) -> Damage:
        def damage(directory: Path) -> str:
            for name in ("msgs/journal.0", "msgs/journal.1"):
                raw = (directory / name).read_bytes()
                if payload(699) in raw:
                    end = raw.index(payload(699)) + len(payload(699))
                    return flip(name, int(fraction * end))(directory)
            raise AssertionError("no journal file holds the newest messages")

        return damage

    return [at(rng.random()) for _ in range(count)]


CASES: dict[str, Damage] = {
    "journal: a record in the middle": in_journal_record(b"500:"),
    "journal: the last record": in_journal_record(b"699:"),
    "journal: deleted": delete("msgs/journal.0"),
    "journal: the other deleted": delete("msgs/journal.1"),
    "journal: emptied": empty("msgs/journal.0"),
    "journal: the other emptied": empty("msgs/journal.1"),
    "messages: one payload": every_copy("msgs/data.mdb", payload(77), 20),
    "messages: 50 bytes of one payload": every_copy("msgs/data.mdb", payload(120), 5, 50),
    "messages: a large message": every_copy("msgs/data.mdb", b"1003:", 4000),
    "messages: meta page": flip("msgs/data.mdb", lambda raw: 40, 16),
    "messages: both meta pages": flip("msgs/data.mdb", lambda raw: 16, 4096 + 40),
    "messages: a page header": flip("msgs/data.mdb", lambda raw: 3 * 4096, 16),
    "messages: truncated": truncate("msgs/data.mdb"),
    "messages: emptied": empty("msgs/data.mdb"),
    "messages: deleted": delete("msgs/data.mdb"),
    "state: meta page": flip("state/data.mdb", lambda raw: 40, 16),
    "state: a page header": flip("state/data.mdb", lambda raw: 2 * 4096, 16),
    "state: truncated": truncate("state/data.mdb"),
    "state: deleted": delete("state"),
    **{f"messages: random byte {i}": d for i, d in enumerate(_random_flips("msgs/data.mdb", 21, 10))},
    **{f"state: random byte {i}": d for i, d in enumerate(_random_flips("state/data.mdb", 22, 8))},
    **{f"journal: random byte {i}": d for i, d in enumerate(_random_journal_flips(23, 6))},
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return command("server_main", *args)


def _stored(directory: Path) -> set[int]:
    with LmdbStore(directory, limits=StoreLimits(channel=ChannelLimits())) as store:
        return {number(m.data) for m in store.read("orders", 1, 10**6)}


def _checked(log: list[str]) -> bool:
    """The server's log says the full check found the store intact."""
    return any(re.search(r"full check of \S+: intact", line) for line in log)


def _lost(report: str) -> set[int]:
    seqs: set[int] = set()
    for spans in re.findall(r"channel 'orders': \d+ messages? lost: ([\d, -]+)", report):
        for span in spans.split(", "):
            first, _, last = span.partition("-")
            seqs.update(range(int(first), int(last or first) + 1))
    return {seq - 1 for seq in seqs}  # message n is seq n + 1


@pytest.mark.parametrize("case", list(CASES))
def test_damage_is_refused_by_name_or_harmless_and_repair_keeps_the_rest(
    case: str, pristine: tuple[Path, frozenset[int]], tmp_path: Path
) -> None:
    source, acked = pristine
    directory = tmp_path / "data"
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("LOCK"))
    damaged = CASES[case](directory)
    started = ServerProcess(["-p", "0", "--dir", str(directory)])
    try:
        started.start(timeout=60)
        # The full check runs while it serves: wait for its verdict (it stops the server on damage).
        wait_for(lambda: started.proc is None or started.proc.poll() is not None or _checked(started.log), 60)
        refused = None if _checked(started.log) else started.log
    except RuntimeError:
        refused = started.log
    finally:
        started.stop()
    if refused is None:  # it started: then nothing acknowledged may be missing
        assert acked <= _stored(directory), f"{case}: the server started without messages it had acknowledged"
        return
    assert started.proc is not None and started.proc.returncode == 1, "refused with an error, not a crash"
    errors = [line for line in refused if "cannot start:" in line or "stopping: the full check found damage:" in line]
    assert len(errors) == 1, refused
    named = "journal" if "journal" in damaged else damaged
    assert named in errors[0], errors[0]
    assert f"streaming-server repair --dir {directory}" in errors[0]

    check = _run("check", "--dir", str(directory))
    assert check.returncode == 1, check.stdout + check.stderr
    repair = _run("repair", "--dir", str(directory), "--cluster_id", CID)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "the old files are in" in repair.stdout
    lost = _lost(repair.stdout)
    assert _lost(check.stdout) == lost, "check reports what repair then loses"
    again = _run("check", "--dir", str(directory))
    assert again.returncode == 0, again.stdout
    if case in ("messages: emptied", "messages: deleted"):
        assert "every channel and message is lost with the message file" in repair.stdout
        return
    stored = _stored(directory)
    assert not lost & stored
    missing = acked - stored
    if case.startswith("state") or case.startswith("messages: meta"):
        assert not missing, "damage outside the messages' pages costs no message"
    else:
        assert missing <= lost, f"lost without being reported: {sorted(missing - lost)[:10]}"
    assert missing == lost & acked or not (lost & acked) - missing


async def test_by_default_nothing_past_a_damaged_message_is_served_and_the_server_stops(
    pristine: tuple[Path, frozenset[int]], tmp_path: Path
) -> None:
    """The default check runs while the server serves: a DeliverAll subscriber that connects at once
    gets nothing past the damaged message (whichever of its read and the check meets it first, and on
    a busy machine the check may stop the server before its port opens), and the server stops with
    the line that names it."""
    source, _ = pristine
    directory = tmp_path / "data"
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("LOCK"))
    every_copy("msgs/data.mdb", payload(120), 5, 50)(directory)
    server = ServerProcess(["-p", "0", "--dir", str(directory)])
    got: dict[int, bytes] = {}
    try:
        try:
            server.start()
        except RuntimeError:
            pass  # the check met the damage before the port opened (a small store, a busy machine)
        else:
            with contextlib.suppress(Exception):  # the server may stop under the reader
                got = await read_channel(server.port, "orders")
        assert server.proc is not None
        server.proc.wait(30)
    finally:
        server.stop()
    assert all(n < 120 for n in got), f"served past the damaged message: {sorted(n for n in got if n >= 120)[:5]}"
    assert server.proc.returncode == 1
    stops = [line for line in server.log if "stopping: the full check found damage:" in line]
    assert len(stops) == 1, server.log
    assert "'orders'" in stops[0] and "121" in stops[0] and "msgs/data.mdb" in stops[0]


async def test_reading_goes_past_a_damaged_message(pristine: tuple[Path, frozenset[int]], tmp_path: Path) -> None:
    """With the quick check at start the server serves a store with a damaged message: a DeliverAll
    subscriber gets every other message, and the log names the message and the file."""
    source, acked = pristine
    directory = tmp_path / "data"
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("LOCK"))
    every_copy("msgs/data.mdb", payload(120), 5, 50)(directory)
    server = ServerProcess(["-p", "0", "--dir", str(directory), "--verify_on_start", "quick"]).start()
    try:
        got = await read_channel(server.port, "orders")
        async with connect(CID, "later", port=server.port) as sc:
            async with sc.subscribe("orders", start_at=StartPosition.SEQUENCE_START, start_sequence=121) as sub:
                assert (await sub.next_msg()).seq == 122  # 121 (message 120) is the damaged one
    finally:
        server.stop()
    assert set(got) == acked - {120}
    assert any(
        "'orders' message 121: stored value is corrupt" in line and "msgs/data.mdb" in line for line in server.log
    )
