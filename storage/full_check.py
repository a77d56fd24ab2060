"""The full check of a serving store's message file, in a process of its own so that it neither holds
the server's event loop nor shares its core: py-lmdb's walk of every page reachable from the committed
root, then every stored message's checksum and every channel's count (`lmdb_verify.scan_snapshot`).

    python -m storage.full_check MSGS_DIR

prints one JSON object, `{"problems": [...], "damaged": {channel: [seq, ...]}, "missing": {...}}`, and
exits 0 whatever it found. `LmdbStore.check_fully` runs it and reads that.

The server keeps writing meanwhile (each checkpoint is an LMDB commit), so the check reads committed
states only, and none that LMDB may write over: it opens the environment read-only through LMDB's own
lock file and begins a read transaction *before* the walk reads the meta pages. LMDB reuses no page
freed after that transaction's snapshot while it is open, so every page reachable from the state the
walk chose (that snapshot or a newer one) stays as the walk read it. The checksums are read in a
transaction begun after the walk: each page of that snapshot was either reached by the walk or written
by the server since (a page, once freed, is only ever rewritten as a new one). A meta page the server
was writing while the walk read it can look damaged: the store confirms any structural finding with a
second walk while it holds its own writes back. A process that gives no answer (it could not start,
or was killed) is no verdict either: the store then runs the whole check itself, the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import lmdb

from storage.codec import decode_channel
from storage.environment import Environment
from storage.integrity import Damage
from storage.lmdb_verify import scan_snapshot
from storage.state_walk import structure_problems

log = logging.getLogger(__name__)
NAMES = ("meta", "channels", "messages")
# A message file this small is checked in the store's own process, its writes held back meanwhile
# (a 4 MiB file: ~1,000 pages, a few tens of milliseconds); a larger one in a process of its own.
IN_PROCESS_BYTES = 4 * 2**20
# The check process's niceness above the server's: on a machine whose cores are all busy serving
# (clients and server), the check waits for them rather than taking a core from them: on 2 cores, a
# restart's 100,000 pending messages were all back in 2.6-2.7 s instead of 3.7-4.2 s (bench/README.md).
NICER_BY = 10


class BackgroundCheck:
    """One run of the check process for a serving store, which can be stopped from any thread (the
    store closing, or a read that met damage first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self.stopped = False

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()

    def run(self, msgs: Environment) -> Damage | None:
        """The damage the check finds in `msgs` (empty: none), or None if it was stopped."""
        started = time.monotonic()
        if (msgs.path / "data.mdb").stat().st_size <= IN_PROCESS_BYTES:
            damage: Damage | None = self._confirm(msgs)  # a few milliseconds: not worth a process
        else:
            damage = self._in_own_process(msgs)
        if damage is None or self.stopped:
            return None
        log.info(
            "full check of %s: %s in %.1f s",
            msgs.path / "data.mdb",
            "damage found" if damage else "intact",
            time.monotonic() - started,
        )
        return damage

    def _in_own_process(self, msgs: Environment) -> Damage | None:
        """The check by `python -m storage.full_check` (None: stopped meanwhile)."""
        with self._lock:
            if self.stopped:
                return None
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "storage.full_check", str(msgs.path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            _lower_priority(self._proc.pid)
        out, err = self._proc.communicate()
        if self.stopped:
            return None
        code = self._proc.returncode
        if code != 0:
            # Not a verdict (it may not even have started: no module path, out of memory, killed), and
            # never a false alarm: the check runs here instead; its walk is safe on any file.
            why = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
            tail = err.strip().splitlines()[-1:] or [""]
            log.warning(
                "the full check's process ended with %s (%s): checking %s here, its writes held back meanwhile",
                why,
                tail[0],
                msgs.path / "data.mdb",
            )
            return self._confirm(msgs)
        damage = from_json(out)
        if damage.problems and not (damage.damaged or damage.missing):
            damage = self._confirm(msgs)  # perhaps a meta page read while the server wrote it
        return damage

    @staticmethod
    def _confirm(msgs: Environment) -> Damage:
        """The check in this process, with the store's writes to the file held back (the file at rest):
        the walk, then every message. For a walk's findings, which may be a meta page read while the
        server wrote it, and when the check's process failed."""
        with msgs.write_lock:
            problems = structure_problems(msgs.path)
            if problems:
                return Damage(problems=problems)
            return msgs.read(lambda txn: scan_committed(txn, msgs.dbs))


def scan_committed(txn: lmdb.Transaction, dbs: Mapping[str, lmdb._Database]) -> Damage:
    """Every message LMDB holds in this transaction's snapshot, against the channel records of the
    same snapshot (what the checkpoints copied: all of each channel is in LMDB)."""
    infos = [decode_channel(v) for v in txn.cursor(db=dbs["channels"]).iternext(keys=False)]
    return scan_snapshot(txn, dbs, [(info, info.last_seq) for info in infos])


def check(msgs_dir: Path) -> Damage:
    """Walk the message file's pages, then (if they are sound) read every message; see the module."""
    env = lmdb.open(str(msgs_dir), readonly=True, lock=True, max_dbs=len(NAMES))
    try:
        dbs = {name: env.open_db(name.encode(), create=False) for name in NAMES}
        with _begin(env):  # held through the walk: no page it may reach is reused meanwhile
            problems = structure_problems(msgs_dir)
        if problems:  # reading through LMDB what failed the walk could crash this process
            return Damage(problems=problems)
        with _begin(env) as txn:
            return scan_committed(txn, dbs)
    finally:
        env.close()


def _begin(env: lmdb.Environment) -> lmdb.Transaction:
    """A read transaction; the server grows its map as the file fills, which this process adopts."""
    while True:
        try:
            return env.begin()
        except lmdb.MapResizedError:
            env.set_mapsize(0)  # 0: the size the file's writer set


def to_json(damage: Damage) -> str:
    return json.dumps(
        {
            "problems": damage.problems,
            "damaged": {name: sorted(seqs) for name, seqs in damage.damaged.items()},
            "missing": {name: sorted(seqs) for name, seqs in damage.missing.items()},
        }
    )


def from_json(text: str) -> Damage:
    found = json.loads(text)
    return Damage(
        problems=list(found["problems"]),
        damaged={name: set(seqs) for name, seqs in found["damaged"].items()},
        missing={name: set(seqs) for name, seqs in found["missing"].items()},
    )


def _lower_priority(pid: int) -> None:
    """Make the check process `NICER_BY` nicer than this one (a process may always lower a priority)."""
    with contextlib.suppress(ProcessLookupError):  # it has ended already: nothing to lower
        os.setpriority(os.PRIO_PROCESS, pid, min(os.getpriority(os.PRIO_PROCESS, 0) + NICER_BY, 19))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m storage.full_check MSGS_DIR", file=sys.stderr)
        return 2
    print(to_json(check(Path(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
