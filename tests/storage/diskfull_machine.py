"""The LMDB store on a disk that fills up, against a model of what was acknowledged, driven by
Hypothesis: appends, checkpoints, filling and freeing the disk, crashes and clean reopenings in any
order. Run inside a private mount namespace with two small tmpfs mounts (see test_disk_full_machine):

    python -m tests.storage.diskfull_machine SMALL BIG EXAMPLES

SMALL holds the store and the ballast that fills it; BIG holds crash snapshots. A crash is the store's
files as they are at that moment (the page cache is what a killed process leaves): they are copied
aside, the store is closed, and the copy is what the next open finds. Checkpoints happen only when a
rule asks, so that the files are never copied in the middle of one.

What must hold after every step: every acknowledged message is stored, with its payload, in order;
a failed append leaves nothing visible, except that after a crash the last one may turn out stored
(the publisher was told it failed; it may publish it again: at least once, never lost).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from storage import ChannelLimits, LmdbStore, NewMessage, StoreError, StoreLimits

UNLIMITED = StoreLimits(channel=ChannelLimits())
CHANNELS = ("a", "b")
# Up to ~800 KB a batch: past the journal's first preallocation within a few, on a 3 MiB disk.
BATCHES = st.lists(st.tuples(st.sampled_from(CHANNELS), st.integers(10, 100_000)), min_size=1, max_size=8)
SMALL = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/nonexistent")
BIG = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/nonexistent")


class DiskFullMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.data = SMALL / "data"
        self.ballast = SMALL / "ballast"
        shutil.rmtree(self.data, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()
        self.acked: dict[str, list[bytes]] = {name: [] for name in CHANNELS}
        self.maybe: dict[str, list[bytes]] | None = None  # the last failed append, by channel
        self.store = self.open()
        for name in CHANNELS:
            self.store.ensure_channel(name)
        self.counter = 0

    def open(self) -> LmdbStore:
        return LmdbStore(
            self.data, limits=UNLIMITED, map_size=256 * 1024, checkpoint_bytes=1 << 40, checkpoint_interval=1e9
        )

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.data, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    @rule(sizes=BATCHES)
    def append(self, sizes: list[tuple[str, int]]) -> None:
        self._append(sizes)

    @rule(sizes=BATCHES)
    def append_again(self, sizes: list[tuple[str, int]]) -> None:
        """Appends are what fill the disk: twice as likely as any other step."""
        self._append(sizes)

    def _append(self, sizes: list[tuple[str, int]]) -> None:
        batch = []
        for channel, size in sizes:
            self.counter += 1
            batch.append(NewMessage(channel, b"%d:" % self.counter + bytes(size)))
        try:
            result = self.store.append(batch)
        except StoreError:
            self.maybe = {name: [m.data for m in batch if m.channel == name] for name in CHANNELS}
            return
        for message, (seq, _) in zip(batch, result.assigned, strict=True):
            assert seq == len(self.acked[message.channel]) + 1
            self.acked[message.channel].append(message.data)
        self.maybe = None

    @rule()
    def checkpoint(self) -> None:
        with contextlib.suppress(StoreError):  # a full disk: the journal keeps it all
            self.store.checkpoint()
            # A failed append's record lies in the file just retired, which is never replayed now.
            self.maybe = None

    @rule(leave=st.sampled_from([0, 0, 16 * 1024, 200 * 1024]))
    def fill(self, leave: int) -> None:
        block = bytes(16 * 1024)
        with open(self.ballast, "ab") as f:
            while True:
                room = os.statvfs(SMALL)
                if leave and room.f_bavail * room.f_frsize < leave + len(block):
                    break
                try:
                    os.write(f.fileno(), block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break

    @rule()
    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    @rule()
    def reopen(self) -> None:
        self.store.close()  # its last checkpoint may fail on a full disk: the journal keeps it all
        self.store = self.open()
        self.maybe = None  # a clean close zeroed what a failed append left, or the next open ignores it

    @rule()
    def crash(self) -> None:
        snapshot = BIG / "crash"
        shutil.rmtree(snapshot, ignore_errors=True)
        _copy(self.data, snapshot)
        (snapshot / "LOCK").unlink()
        self.store.close()
        shutil.rmtree(self.data)
        _copy(snapshot, self.data)  # fits: it was there a moment ago
        self.store = self.open()
        if self.maybe is not None:  # the failed append may have reached the disk whole: then it counts
            for name, extra in self.maybe.items():
                stored = len(self.store.read(name, 1, 10**6))
                if extra and stored == len(self.acked[name]) + len(extra):
                    self.acked[name] += extra
        self.maybe = None

    @invariant()
    def every_acknowledged_message_is_stored(self) -> None:
        for name in CHANNELS:
            got = [m.data for m in self.store.read(name, 1, 10**6)]
            assert got == self.acked[name], (name, len(got), len(self.acked[name]))
            info = self.store.channel_info(name)
            assert info is not None and info.last_seq == len(self.acked[name])


def _copy(source: Path, target: Path) -> None:
    """Files as they are, holes and all (LMDB's lock file is sparse: a full copy would not fit back)."""
    subprocess.run(["cp", "-a", "--sparse=always", str(source), str(target)], check=True)


def main(examples: int) -> None:
    logging.disable(logging.CRITICAL)  # a full disk makes the store log at every step: the example is what counts
    # Typed in newer Hypothesis releases, not in older ones: one call that type-checks with both.
    run = cast(Callable[..., None], run_state_machine_as_test)
    run(
        DiskFullMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
    print(f"ok: {examples} examples", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[3]))
