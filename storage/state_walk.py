"""The structure walk of an LMDB environment (py-lmdb's offline verifier, `lmdb.verify`: a pure-Python
walk of every page reachable from the roots, before LMDB reads any of them), and that walk begun ahead
in a forked child (`WalkAhead`).

A module of its own that imports nothing else of the store (and `import storage` loads only this):
`streaming-server` forks the walk of its state file at its first line, so that the child starts walking
at once (loading the store's records and codecs first cost it ~0.06 s) while the server loads its
modules.

A clean stop seals its state file (`seal`): it walks the closed file and, when the walk finds nothing,
writes the digest of its bytes beside it. The next start that finds the file byte for byte as sealed
takes the walk's answer from the seal (`walk_unless_sealed`): the walk of the same bytes finds the
same. Anything else (a crash, a file changed or damaged since, a seal that cannot be read) is walked.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

__all__ = [
    "SEAL_NAME",
    "WALK_AHEAD_BYTES",
    "WalkAhead",
    "seal",
    "structure_problems",
    "walk_unless_sealed",
    "without_reused_runs",
]


def structure_problems(env_dir: Path) -> list[str]:
    """Every structural problem py-lmdb's offline verifier finds in an environment (its data.mdb)."""
    # Loaded here, by name: a child walking ahead loads it after its fork, and `import storage` (which
    # loads this module) never loads LMDB.
    verifier: Any = importlib.import_module("lmdb.verify")
    try:
        return without_reused_runs(list(verifier.verify(str(env_dir))))
    except verifier.VerifyError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"cannot be read ({exc})"]


_REUSED_RUN = re.compile(r"(.+) DB: overflow page (\d+) header mp_pages (\d+) != OVPAGES\(\d+\)=(\d+)")
_OVERFLOW_COUNT = re.compile(r"(.+) DB: walked (\d+) overflow pages, record says (\d+)")
_LEAK = re.compile(r"(\d+) page\(s\) are neither reachable nor in the freeDB -- a leak \(first: page (\d+)\)")


def without_reused_runs(problems: list[str]) -> list[str]:
    """The verifier's findings less what it reports of a legal file: LMDB rewrites a value kept on
    overflow pages of its own, written earlier in the same transaction, in place, and keeps the run's
    page count when the new value needs fewer. The verifier then reports the run's count, its
    database's count of overflow pages, and the run's pages past what the value needs (neither reached
    nor free). Those three are dropped only when they agree exactly (the counts differ by those pages,
    and they are all the pages reported as leaked); anything else stays."""
    extra: dict[str, int] = {}  # database -> pages its reused runs hold past what their values need
    pages: set[int] = set()
    reused: set[str] = set()
    for problem in problems:
        run = _REUSED_RUN.fullmatch(problem)
        if run and int(run[3]) > int(run[4]):
            first, have, need = int(run[2]), int(run[3]), int(run[4])
            extra[run[1]] = extra.get(run[1], 0) + have - need
            pages.update(range(first + need, first + have))
            reused.add(problem)
    if not reused:
        return problems
    rest, explained_dbs, leak_explained = [], set(), False
    for problem in problems:
        count, leak = _OVERFLOW_COUNT.fullmatch(problem), _LEAK.fullmatch(problem)
        if problem in reused:
            continue
        if count and int(count[3]) - int(count[2]) == extra.get(count[1]):
            explained_dbs.add(count[1])
            continue
        if leak and int(leak[1]) == len(pages) and int(leak[2]) == min(pages):
            leak_explained = True
            continue
        rest.append(problem)
    # The pages past what the values need must be neither reached nor free (a free one would be freed
    # twice when LMDB drops the run), and every count must add up; else everything is reported.
    if not leak_explained or explained_dbs != set(extra):
        return problems
    return rest


WALK_AHEAD_BYTES = 1 << 20  # a state file this large is walked in a forked child
SEAL_NAME = "walked"  # beside data.mdb: the size and digest of the bytes a walk last found clean


def walk_unless_sealed(env_dir: Path) -> list[str]:
    """`structure_problems` of an environment, or none when its data file holds exactly the bytes a
    walk found clean when they were sealed (`seal`)."""
    try:
        sealed = (env_dir / SEAL_NAME).read_text()
    except (OSError, ValueError):
        sealed = None
    if sealed is not None and sealed == _digest(env_dir / "data.mdb"):
        return []
    return structure_problems(env_dir)


def seal(env_dir: Path) -> bool:
    """After a clean stop, with nothing writing the environment any more: walk its data file and, when
    the walk finds nothing, write the file's digest beside it so that the next start need not walk it
    again. A file with problems is left unsealed (the next start walks it and reports them). Returns
    whether it was sealed."""
    path, data = env_dir / SEAL_NAME, env_dir / "data.mdb"
    path.unlink(missing_ok=True)
    if structure_problems(env_dir):
        return False
    digest = _digest(data)
    if digest is None:
        return False
    part = path.with_name(SEAL_NAME + ".part")
    with open(part, "w") as out:
        out.write(digest)
        out.flush()
        os.fsync(out.fileno())
    os.replace(part, path)
    return True


def _digest(data_file: Path) -> str | None:
    """The size and BLAKE2b digest of a file's bytes (None if it cannot be read): 2-3 ms a megabyte
    here, where the walk takes 65-115 ms."""
    try:
        with open(data_file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return f"{size} {hashlib.file_digest(f, 'blake2b').hexdigest()}"
    except OSError:
        return None


class WalkAhead:
    """`structure_problems` of an environment, begun in a forked child so that it runs on another core
    while this process goes on (the server loads its modules meanwhile: a restart with 100,000 pending
    messages walks its state file for 0.17-0.34 s on a 2-core machine, about as long as that takes).
    Fork early, before any thread exists.

    Its answer is used only if it found nothing and the file is still as it was when the walk began
    (same inode, size and modification time: nothing wrote it meanwhile, such as another server that
    held the directory until just now); anything else is walked again, here, by `problems`."""

    def __init__(self, env_dir: Path) -> None:
        self.env_dir = env_dir
        self._stamp = _stamp(env_dir / "data.mdb")
        self._child: tuple[int, int] | None = None  # pid, read end of its pipe
        if self._stamp is None or self._stamp[1] < WALK_AHEAD_BYTES or not hasattr(os, "fork"):
            return  # walked by `problems`, here: a small file takes milliseconds
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: walk, answer, and leave without running anything of the parent's
            status = 1
            try:
                os.close(read)
                with os.fdopen(write, "w") as out:
                    json.dump(walk_unless_sealed(env_dir), out)
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        self._child = (pid, read)

    def discard(self) -> None:
        """Stop the walk and forget it (the store will not use it)."""
        if self._child is not None:
            pid, read = self._child
            self._child = None
            os.close(read)
            os.kill(pid, signal.SIGKILL)  # an unreaped child: its pid is still its own
            os.waitpid(pid, 0)

    def problems(self) -> list[str]:
        """What the walk found, once; walked here instead when its answer cannot be used."""
        found: object = None
        if self._child is not None:
            pid, read = self._child
            self._child = None
            with os.fdopen(read) as answer:
                text = answer.read()
            os.waitpid(pid, 0)
            try:
                found = json.loads(text)
            except ValueError:  # it died (a signal): walk here
                found = None
        if found == [] and _stamp(self.env_dir / "data.mdb") == self._stamp:
            return []
        return walk_unless_sealed(self.env_dir)


def _stamp(data_file: Path) -> tuple[int, int, int] | None:
    try:
        st = data_file.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
