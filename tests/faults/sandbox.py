"""A real server on a small disk of its own: a tmpfs mounted in a private mount namespace
(`unshare -rm`, no root needed), which only the processes started inside can see.

The test talks to a controller process running inside the namespace (`python -m tests.faults.sandbox
MOUNT`), one JSON line per command and per answer: start the server on the small disk, signal it,
fill the disk with a ballast file, free it. The network is not in the namespace, so clients connect
to the server from the test as usual.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def can_mount_private_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return probe.returncode == 0


class Sandbox:
    """The test's side: one controller, one small disk, at most one server at a time."""

    def __init__(self, mount: Path, size_mb: int) -> None:
        mount.mkdir(parents=True, exist_ok=True)
        script = f'mount -t tmpfs -o size={size_mb}m tmpfs "{mount}" && exec "$@"'
        self.proc = subprocess.Popen(
            ["unshare", "-rm", "sh", "-c", script, "sh", sys.executable, "-m", "tests.faults.sandbox", str(mount)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.mount = mount
        self.port = 0
        self.http_port = 0  # with -m -1

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"the sandbox controller died: {err}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def start(self, *flags: str) -> dict[str, Any]:
        """Start the server on the small disk; returns {"port": ...} or {"exit": code, "log": [...]}."""
        answer = self.call("start", flags=list(flags))
        self.port = answer.get("port", 0)
        self.http_port = answer.get("http_port", 0)
        return answer

    def stop(self, sig: int = signal.SIGTERM) -> dict[str, Any]:
        return self.call("signal", sig=int(sig))

    def fill(self, leave: int = 0) -> int:
        """Fill the disk but for `leave` bytes (another process's files); returns what the ballast took."""
        return int(self.call("fill", leave=leave)["bytes"])

    def free(self) -> None:
        self.call("free")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("quit")
        self.proc.wait(30)


@contextlib.contextmanager
def sandbox(mount: Path, size_mb: int = 8) -> Iterator[Sandbox]:
    box = Sandbox(mount, size_mb)
    try:
        yield box
    finally:
        box.close()


# -- the controller, inside the namespace ------------------------------------------------------


class _Controller:
    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.data = mount / "data"
        self.ballast = mount / "ballast"
        self.server: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    def start(self, flags: list[str]) -> dict[str, Any]:
        self.log = []
        self.server = subprocess.Popen(
            [sys.executable, "-m", "streaming", "-a", "127.0.0.1", "-p", "0", "--dir", str(self.data), *flags],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        found = threading.Event()
        port: list[int] = []
        http: list[int] = []

        def pump() -> None:
            assert self.server is not None and self.server.stderr is not None
            for line in self.server.stderr:
                self.log.append(line.rstrip())
                monitoring = re.search(r"Listening for HTTP monitoring on [^:]+:(\d+)", line)
                if monitoring:
                    http.append(int(monitoring.group(1)))
                match = re.search(r"Listening for client connections on [^:]+:(\d+)", line)
                if match:
                    port.append(int(match.group(1)))
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        found.wait(60)
        if port:
            return {"port": port[0], "http_port": http[0] if http else 0}
        code = self.server.wait(30)
        return {"exit": code, "log": self.log}

    def signal(self, sig: int) -> dict[str, Any]:
        if self.server is None:
            return {"exit": None, "log": self.log}
        if self.server.poll() is None:
            self.server.send_signal(sig)
        code = self.server.wait(60)
        self.server = None
        return {"exit": code, "log": self.log}

    def fill(self, leave: int) -> dict[str, Any]:
        written = 0
        block = b"\0" * (64 * 1024)
        with open(self.ballast, "ab") as f:
            while True:
                if leave:
                    room = os.statvfs(self.mount)
                    if room.f_bavail * room.f_frsize - len(block) < leave:
                        return {"bytes": written}
                try:
                    written += os.write(f.fileno(), block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        for size in (4096, 512, 1):  # what is left at the end of the last block
            with contextlib.suppress(OSError), open(self.ballast, "ab") as f:
                while True:
                    written += os.write(f.fileno(), b"\0" * size)
        return {"bytes": written}

    def free(self) -> dict[str, Any]:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()
        return {}


def _serve(mount: Path) -> None:
    controller = _Controller(mount)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            if op == "quit":
                controller.signal(signal.SIGKILL)
                print(json.dumps({}), flush=True)
                return
            answer = getattr(controller, op)(**command)
        except Exception as exc:  # the test gets it, with what happened
            answer = {"error": f"{op}: {exc!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
