"""`bench.peers.pin_apart`: a server's every thread on the last CPU, the benchmark's on the others."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.peers import Server, pin_apart

SERVER = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"


def _threads(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and 2 CPUs"
)
def test_pin_apart_puts_the_server_and_the_clients_on_different_cpus() -> None:
    """Twice: the second server is started by a process already pinned to the clients' CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    ours_before = {tid: os.sched_getaffinity(tid) for tid in _threads(os.getpid())}
    try:
        for _ in range(2):
            proc = subprocess.Popen([sys.executable, "-c", SERVER])
            try:
                deadline = time.monotonic() + 10
                while len(_threads(proc.pid)) < 2:  # both of its threads, to see that each is pinned
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                assert pin_apart(Server("sleeper", 0, proc.pid, Path(".")))
                assert {tid: os.sched_getaffinity(tid) for tid in _threads(proc.pid)} == {
                    tid: {cpus[-1]} for tid in _threads(proc.pid)
                }
                assert all(os.sched_getaffinity(tid) == set(cpus[:-1]) for tid in _threads(os.getpid()))
            finally:
                proc.kill()
                proc.wait()
    finally:
        for tid, allowed in ours_before.items():
            if tid in _threads(os.getpid()):
                os.sched_setaffinity(tid, allowed)
