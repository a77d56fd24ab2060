"""Crash test: SIGKILL a writer at random moments; nothing it reported as committed may be lost.

The child (writer_child.py `crash`) appends batches and prints the last sequence of each batch once
`append` has returned, i.e. once a PubAck could have been sent. After each kill the store must open
cleanly, hold every reported sequence with its exact payload, keep sequences contiguous, and the next
writer must continue right after the last stored message. CRASH_KILLS sets the number of kills
(default 20, the CI minimum).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage import LmdbStore
from storage.codec import message_size
from tests.storage.writer_child import UNLIMITED, payload

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("sync", [True, False], ids=["file_sync", "no_file_sync"])
def test_sigkill_never_loses_a_committed_batch(tmp_path: Path, sync: bool) -> None:
    """Also without an fsync per commit: what a killed process committed is in the page cache."""
    kills = int(os.environ.get("CRASH_KILLS", "20"))
    rng = random.Random(20261121)
    verified_up_to = 0  # every message up to here was checked byte for byte
    total_reported = 0
    for round_no in range(kills):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.storage.writer_child", "crash", str(tmp_path), str(round_no)]
            + ([] if sync else ["nosync"]),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        first_line = proc.stdout.readline()
        assert first_line.startswith("start "), proc.stderr.read() if proc.stderr else first_line
        assert int(first_line.split()[1]) == verified_up_to + 1, "the writer continues after the last stored message"
        time.sleep(rng.uniform(0.0, 0.25))  # a random moment, usually in the middle of a commit
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err
        reported = [int(line.split()[1]) for line in out.splitlines() if line.startswith("committed ")]
        total_reported += len(reported)

        with LmdbStore(tmp_path, limits=UNLIMITED) as store:
            info = store.channel_info("crash")
            assert info is not None
            if reported:
                assert info.last_seq >= reported[-1], f"round {round_no}: acknowledged messages are missing"
            assert (info.first_seq, info.msgs) == (1, info.last_seq), "sequences are contiguous from 1"
            fresh = store.read("crash", verified_up_to + 1, info.last_seq)  # checksums verified on read
            assert [m.seq for m in fresh] == list(range(verified_up_to + 1, info.last_seq + 1))
            for msg in fresh:
                assert msg.data == payload(msg.seq), f"message {msg.seq} is not what was written"
            sample = store.read("crash", 1, 50)
            assert all(m.data == payload(m.seq) for m in sample)
            assert info.bytes == sum(message_size(b"", payload(s)) for s in range(1, info.last_seq + 1))
            (sub,) = store.recover().subscriptions
            assert sub.record.last_sent <= info.last_seq
            verified_up_to = info.last_seq
    assert total_reported >= kills // 2, "most rounds should have committed something before the kill"
