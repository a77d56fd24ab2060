"""What the importer refuses, and how: one clear line naming the file and the offset (or the reason),
a non-zero exit, and no data directory left behind; what it works around says so in its output."""

from __future__ import annotations

import fcntl
import struct
from pathlib import Path

import pytest

from storage import LmdbStore
from tests.stan_import.support import STORES, copy, digests, import_stan, manifest

INDEX_ENTRY = struct.Struct("<QQqII")


def refused(done: object, target: Path) -> str:
    assert getattr(done, "returncode", None) == 1, getattr(done, "stdout", "")
    err: str = getattr(done, "stderr", "")
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert not target.exists()
    assert not list(target.parent.glob(f".{target.name}.importing-*"))
    return lines[0]


def entry_offset(index: Path, seq: int) -> int:
    data = index.read_bytes()
    for at in range(4, len(data), INDEX_ENTRY.size):
        found, offset, *_ = INDEX_ENTRY.unpack_from(data, at)
        if found == seq:
            return int(offset)
    raise AssertionError(f"no entry for {seq}")


def test_a_torn_last_record_is_refused_unless_dropped(tmp_path: Path) -> None:
    torn = manifest("truncated_tail")["import"]["torn"]
    line = refused(import_stan(STORES / "truncated_tail", tmp_path / "data"), tmp_path / "data")
    assert torn["file"] in line and f"at byte {torn['record_offset']}" in line and "--drop_partial_tail" in line
    done = import_stan(STORES / "truncated_tail", tmp_path / "data", "--drop_partial_tail")
    assert done.returncode == 0, done.stderr
    assert f"the torn record was message {torn['seq']}" in done.stdout
    with LmdbStore(tmp_path / "data") as store:
        info = store.channel_info(torn["channel"])
        assert info is not None and info.last_seq == torn["seq"] - 1


def test_a_damaged_record_in_the_middle_is_refused_by_name(tmp_path: Path) -> None:
    source = copy("basic", tmp_path)
    data = source / "orders.eu" / "msgs.1.dat"
    offset = entry_offset(source / "orders.eu" / "msgs.1.idx", 100)
    raw = bytearray(data.read_bytes())
    raw[offset + 8 + 12] ^= 0xFF  # inside the payload: only the checksum can tell
    data.write_bytes(bytes(raw))
    line = refused(import_stan(source, tmp_path / "data"), tmp_path / "data")
    assert "orders.eu/msgs.1.dat: checksum mismatch" in line and f"at byte {offset}" in line


def test_an_index_that_disagrees_with_its_data_file_is_rebuilt_from_it(tmp_path: Path) -> None:
    source = copy("basic", tmp_path)
    index = source / "audit" / "msgs.1.idx"
    index.write_bytes(index.read_bytes()[: 4 + 32 * 50 + 7])  # cut inside an entry
    bad = source / "x.y.z" / "msgs.1.idx"
    raw = bytearray(bad.read_bytes())
    raw[-32] ^= 1  # the last entry's checksum fails
    bad.write_bytes(bytes(raw))
    done = import_stan(source, tmp_path / "data")
    assert done.returncode == 0, done.stderr
    assert "audit/msgs.1.idx: the index ends inside an entry" in done.stdout
    assert "x.y.z/msgs.1.idx: index entry checksum mismatch" in done.stdout
    with LmdbStore(tmp_path / "data") as store:
        for channel in manifest("basic")["channels"]:
            info = store.channel_info(channel["name"])
            assert info is not None and info.msgs == len(channel["messages"])


def test_a_wrong_key_or_none_fails_with_one_line(tmp_path: Path) -> None:
    for name in ("encrypted_aes", "encrypted_chacha"):
        line = refused(
            import_stan(STORES / name, tmp_path / "data", "--encryption_key", "not-the-key"), tmp_path / "data"
        )
        assert "does not authenticate with this key: wrong --encryption_key" in line
        line = refused(import_stan(STORES / name, tmp_path / "data"), tmp_path / "data")
        assert "every payload looks encrypted" in line and "--encryption_key" in line


def test_the_wrong_checksum_polynomial_is_named(tmp_path: Path) -> None:
    line = refused(import_stan(STORES / "crc_poly", tmp_path / "data"), tmp_path / "data")
    assert "give --crc_poly 0x82f63b78" in line
    done = import_stan(STORES / "crc_poly", tmp_path / "data", "--crc_poly", "2197175160")
    assert done.returncode == 0, done.stderr


def test_a_clustered_node_is_refused_or_imported_without_its_state(tmp_path: Path) -> None:
    line = refused(import_stan(STORES / "clustered_node", tmp_path / "data"), tmp_path / "data")
    assert "clustered node 'n1'" in line and "Raft log" in line and "--messages_only" in line
    done = import_stan(STORES / "clustered_node", tmp_path / "data", "--messages_only")
    assert done.returncode == 0, done.stderr
    with LmdbStore(tmp_path / "data") as store:
        state = store.recover()
        assert not state.subscriptions and not state.clients
        held = {c.name: (c.first_seq, c.last_seq, c.msgs) for c in state.channels}
    assert held == {
        c["name"]: (c["first_seq"], c["last_seq"], c["msgs"]) for c in manifest("clustered_node")["channels"]
    }


def test_a_torn_subscription_record_is_refused_unless_dropped(tmp_path: Path) -> None:
    source = copy("basic", tmp_path)
    subs = source / "orders.eu" / "subs.dat"
    subs.write_bytes(subs.read_bytes()[:-3])
    line = refused(import_stan(source, tmp_path / "data"), tmp_path / "data")
    assert "orders.eu/subs.dat: the file ends" in line
    done = import_stan(source, tmp_path / "data", "--drop_partial_tail")
    assert done.returncode == 0 and "orders.eu/subs.dat: dropped the torn record" in done.stdout


def test_a_store_in_use_is_refused(tmp_path: Path) -> None:
    source = copy("basic", tmp_path)
    with (source / ".rootdir.lck").open("wb") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a fault-tolerant server holds it
        line = refused(import_stan(source, tmp_path / "data"), tmp_path / "data")
    assert "is locked: a nats-streaming-server is running on this store" in line
    assert import_stan(source, tmp_path / "data").returncode == 0  # let go: importable


def test_a_dry_run_writes_nothing_and_a_used_directory_is_refused(tmp_path: Path) -> None:
    before = digests(STORES / "basic")
    done = import_stan(STORES / "basic", tmp_path / "data", "--dry_run")
    assert done.returncode == 0, done.stderr
    assert "would write" in done.stdout and not (tmp_path / "data").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "something").write_text("mine")
    done = import_stan(STORES / "basic", tmp_path / "used")
    assert done.returncode == 1 and "is not empty" in done.stderr
    assert (tmp_path / "used" / "something").read_text() == "mine"
    assert digests(STORES / "basic") == before


def test_a_directory_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "nothing").mkdir()
    line = refused(import_stan(tmp_path / "nothing", tmp_path / "data"), tmp_path / "data")
    assert "no server.dat here" in line
    source = copy("basic", tmp_path)
    (source / "clients.dat").write_bytes(b"\x02\x00\x00\x00")
    line = refused(import_stan(source, tmp_path / "data"), tmp_path / "data")
    assert "clients.dat: file version 2" in line


def test_the_key_in_the_environment_wins_as_for_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NATS_STREAMING_ENCRYPTION_KEY", "fixture-key-1")
    done = import_stan(STORES / "encrypted_aes", tmp_path / "data", "--encryption_key", "not-the-key")
    assert done.returncode == 0, done.stderr


def test_without_checksums_a_changed_payload_is_taken_as_it_is(tmp_path: Path) -> None:
    source = copy("basic", tmp_path)
    data = source / "orders.eu" / "msgs.1.dat"
    offset = entry_offset(source / "orders.eu" / "msgs.1.idx", 1)
    raw = bytearray(data.read_bytes())
    at = raw.index(b"orders.eu message 1", offset)
    raw[at] = ord("O")  # the data changes; the record still parses, only its checksum fails
    data.write_bytes(bytes(raw))
    refused(import_stan(source, tmp_path / "data"), tmp_path / "data")
    done = import_stan(source, tmp_path / "data", "--no_crc")
    assert done.returncode == 0, done.stderr
    with LmdbStore(tmp_path / "data") as store:
        first = store.get("orders.eu", 1)
        assert first is not None and first.data.startswith(b"Orders.eu message 1")
