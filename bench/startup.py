"""Start-up: from exec to a server answering its port, and the `streaming` client command's own start.

    python bench/startup.py [--quick] [--json] [--rounds N] [--from-source]

- ours: `python -m streaming -p PORT --dir FRESH` (LMDB store created), timed from `Popen` to the
  first byte the NATS port sends (its INFO line); then the same with the monitoring port on
  (`-m -1`: any free port), which loads the HTTP stack (hypercorn, Starlette, prometheus_client);
- nats-streaming-server (`STAN_SERVER`, else ../shared/peers/nats-streaming-server; skipped when
  absent), FILE store in a fresh directory, timed the same way;
- `streaming --help`: the client command, exec to exit.
Every round runs each once, alternating, on a fresh data directory; figures are medians. Target
(issue: start-up): ours answering within 0.3 s of exec. Full: 9 rounds; quick: 3.

Our packages' bytecode is compiled before the first round, as `pip install .` compiles it: run from
a checkout where Python may not write its cache (`PYTHONDONTWRITEBYTECODE=1`, as on the machine that
took the figures), every start would otherwise compile every module of ours from source, a cost no
installed server pays (`--from-source` times that).
"""

from __future__ import annotations

import compileall
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.peers import free_port, stan_binary, stan_command, stop  # noqa: E402
from bench.report import arguments, machine, print_report  # noqa: E402

_ENV = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")  # what is compiled (or not) stays so across rounds


def answering(argv: list[str], port: int, timeout: float = 20.0) -> float:
    """Seconds from exec of `argv` until `port` sends its first bytes; the process is stopped after."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{argv[0]} exited with {proc.returncode} before answering")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
                    if conn.recv(16):
                        return time.perf_counter() - started
            except OSError:
                pass
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"{argv[0]} did not answer within {timeout} s")
            time.sleep(0.002)
    finally:
        stop(proc)


def run_once(system: str, binary: str | None) -> float:
    data = Path(tempfile.mkdtemp(prefix=f"bench-startup-{system}-"))
    port = free_port()
    try:
        if system == "ours":
            return answering(
                [sys.executable, "-m", "streaming", "-a", "127.0.0.1", "-p", str(port), "--dir", str(data)], port
            )
        if system == "ours_monitoring":
            argv = [
                sys.executable,
                "-m",
                "streaming",
                "-a",
                "127.0.0.1",
                "-p",
                str(port),
                "--dir",
                str(data),
                "-m",
                "-1",
            ]
            return answering(argv, port)
        if system == "client_help":
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", "from streaming.cli import client_main; client_main(['--help'])"],
                cwd=ROOT,
                env=_ENV,
                stdout=subprocess.DEVNULL,
                check=True,
            )
            return time.perf_counter() - started
        assert binary is not None
        return answering(stan_command(binary, port, data), port)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = arguments(__doc__, quick="3 rounds")
    parser.add_argument("--rounds", type=int, help="rounds (default 9, quick 3)")
    parser.add_argument(
        "--from-source", action="store_true", help="our modules compiled at every start (no bytecode written)"
    )
    args = parser.parse_args()
    console = Console(stderr=args.json)
    rounds = args.rounds or (3 if args.quick else 9)
    for package in ("streaming", "storage"):  # what an install compiles (see the docstring)
        if args.from_source:
            for cache in (ROOT / package).rglob("__pycache__"):
                shutil.rmtree(cache)
        else:
            compileall.compile_dir(ROOT / package, quiet=1)
    binary = stan_binary()
    systems = ["ours", "ours_monitoring", "client_help"] + (["stan"] if binary else [])
    samples: dict[str, list[float]] = {s: [] for s in systems}
    for round_ in range(rounds):
        for system in systems if round_ % 2 == 0 else list(reversed(systems)):
            samples[system].append(run_once(system, binary))
    result: dict[str, Any] = {"scale": "quick" if args.quick else "full", "machine": machine(), "rounds": rounds}
    result["bytecode"] = "compiled at every start" if args.from_source else "compiled once, as by an install"
    for system, values in samples.items():
        result[f"{system}_s"] = round(statistics.median(values), 3)
        result[f"{system}_range_s"] = [round(min(values), 3), round(max(values), 3)]
    rows = [
        (f"{s} (median, min-max)", f"{result[s + '_s']} ({result[s + '_range_s'][0]}-{result[s + '_range_s'][1]})", "")
        for s in systems
    ]
    rows[0] = (rows[0][0], rows[0][1], "<= 0.3 s")
    if binary is None:
        rows.append(("nats-streaming-server", "not found (STAN_SERVER)", ""))
    print_report(console, "Start-up: exec to answering, seconds", rows, result, args.json)


if __name__ == "__main__":
    main()
