"""Every benchmark, one after another, and one table of the headline figures against their targets.

    python bench/run_all.py [--quick] [--json] [--runs N] [--only NAME ...] [--markdown FILE.md] [--plots DIR]

Each script runs in its own process with `--json` (and `--quick` when given); its last line is its
result. The table lists the figures the issues set targets for; `--markdown` writes the same table
(with the date, the machine and the command) for bench/README.md; `--plots DIR` passes `--plot` to
the scripts that draw one. With `--json` the last line holds every script's result by name.
`--runs N` runs the whole set N times, one set after the other: the table then has a value per run,
and says in how many runs each target held (the JSON line is `{"runs": [...]}`, one result per run).
Where the Node clients are installed (`npm ci --prefix bench/node`), publish, consume and event_log
also run with Node clients on both sides (`--clients both`), the fair comparison with JetStream, and
bayeux and rest run (the CometD client against ours and Faye; the HTTP pull API against the ceiling of
its HTTP stack).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from bench.report import print_report  # noqa: E402

SCRIPTS = (
    "publish",
    "consume",
    "redelivery",
    "nak",
    "wildcard",
    "latency",
    "recovery",
    "startup",
    "storm",
    "wire",
    "engine",
    "storage",
    "event_log",
    "bayeux",
    "rest",
)
# These need the Node clients: the CometD client and Faye as its peer; a keep-alive HTTP client.
NODE_ONLY = {"bayeux", "rest"}
PLOTS = {"publish", "consume", "redelivery", "latency", "storm"}
# Where Node is installed (`npm ci --prefix bench/node`), these also run with fast clients on both sides.
NODE_ARGS = {"publish": ["--clients", "both"], "consume": ["--clients", "both"], "event_log": ["--clients", "both"]}

NODE_READY = (ROOT / "bench" / "node" / "node_modules").exists()
Check = Callable[[Any], bool]
# (script, key, target as written, check)
HEADLINES: list[tuple[str, str, str, Check | None]] = [
    ("publish", "ratio_async_vs_jetstream", ">= 2.5", lambda v: v >= 2.5),
    ("publish", "ratio_async_vs_redis", "", None),
    ("publish", "ratio_sync_vs_jetstream", ">= 1.5", lambda v: v >= 1.5),
    ("publish", "ratio_sync_vs_jetstream_sync", "", None),
    ("publish", "ours_sync_fraction_of_limit", ">= 0.7", lambda v: v >= 0.7),
    ("publish", "ours_sync_ceiling_fraction", "", None),
    ("publish", "floor_trio_fraction_of_limit", "", None),
    ("publish", "floor_blocking_fraction_of_limit", "", None),
    ("publish", "node_ours_sync_fraction_of_limit", "", None),
    ("publish", "node_ratio_sync_vs_jetstream_sync", "", None),
    ("publish", "node_ratio_async_vs_jetstream", ">= 3", lambda v: v >= 3),
    ("publish", "node_ours_async_128_server_us_per_msg", "<= 6", lambda v: v <= 6),
    ("publish", "node_ratio_async_vs_stan", ">= 1.5", lambda v: v >= 1.5),
    ("publish", "node_ratio_sync_vs_stan", ">= 1.5", lambda v: v >= 1.5),
    ("publish", "node_cpu_ratio_async_vs_stan", "<= 1.0", lambda v: v <= 1.0),
    ("publish", "node_cpu_ratio_sync_vs_stan", "<= 1.0", lambda v: v <= 1.0),
    ("publish", "node_client_ceiling_async_vs_stan", "", None),
    ("consume", "ratio_vs_jetstream", ">= 1.0", lambda v: v >= 1.0),
    ("consume", "ratio_queue4_vs_jetstream", "", None),
    ("consume", "ratio_1sub_vs_redis", "", None),
    ("consume", "node_ratio_1sub_vs_jetstream", ">= 1.5", lambda v: v >= 1.5),
    ("consume", "node_ratio_10subs_vs_jetstream", ">= 1.2", lambda v: v >= 1.2),
    ("consume", "node_ratio_queue4_vs_jetstream", ">= 1.2", lambda v: v >= 1.2),
    ("consume", "node_ours_1sub_server_us_per_msg", "<= 10", lambda v: v <= 10),
    ("consume", "node_ours_10subs_server_us_per_msg", "<= 10", lambda v: v <= 10),
    ("consume", "node_ours_queue4_server_us_per_msg", "<= 10", lambda v: v <= 10),
    *[
        (("consume", f"node_ratio_{case}_vs_stan", ">= 1.5", lambda v: v >= 1.5))
        for case in ("1sub", "10subs", "queue4")
    ],
    *[
        (("consume", f"node_cpu_ratio_{case}_vs_stan", "<= 1.0", lambda v: v <= 1.0))
        for case in ("1sub", "10subs", "queue4")
    ],
    *[(("consume", f"node_client_ceiling_{case}_vs_stan", "", None)) for case in ("1sub", "10subs", "queue4")],
    ("redelivery", "lateness_p99_ms", "", None),
    ("redelivery", "lateness_p99_ratio_vs_jetstream", "<= 1", lambda v: v <= 1),
    ("redelivery", "lateness_p99_ratio_vs_stan", "", None),
    ("redelivery", "redelivered_once_fraction", "1.0", lambda v: v == 1.0),
    ("redelivery", "jetstream_lateness_p99_ms", "", None),
    ("redelivery", "ours_logged_lateness_p99_ms", "", None),
    ("redelivery", "ours_logged_server_lateness_p99_ms", "", None),
    ("nak", "ours_lateness_p99_ms", "", None),
    ("nak", "lateness_p99_ratio_vs_jetstream", "", None),
    ("nak", "ours_early", "0", lambda v: v == 0),
    ("nak", "server_cpu_ratio_vs_jetstream", "", None),
    ("wildcard", "wildcard_vs_plain_throughput", ">= 1", lambda v: v >= 1),
    ("wildcard", "wildcard_vs_plain_cpu", "<= 1", lambda v: v <= 1),
    ("wildcard", "ordered_vs_unordered_throughput", ">= 0.8", lambda v: v >= 0.8),
    ("wildcard", "ordered_order_violations", "0", lambda v: v == 0),
    ("latency", "p50_ms", "", None),
    ("latency", "p99_ms", "", None),
    ("latency", "p50_ratio_vs_jetstream", "<= 1", lambda v: v <= 1),
    ("latency", "p99_ratio_vs_jetstream", "<= 1", lambda v: v <= 1),
    ("latency", "p50_ratio_vs_jetstream_sync", "", None),
    ("latency", "p99_ratio_vs_jetstream_sync", "", None),
    ("latency", "nosync_p50_ratio_vs_jetstream", "", None),
    ("latency", "nosync_p99_ratio_vs_jetstream", "", None),
    ("latency", "p50_ratio_vs_stan", "", None),
    ("latency", "p99_ratio_vs_stan", "", None),
    ("recovery", "ours_ready_s", "", None),
    ("recovery", "ours_pending_redelivered_s", "", None),
    ("recovery", "ours_rss_mb", "", None),
    ("recovery", "jetstream_ready_s", "", None),
    ("recovery", "ready_ratio_vs_jetstream", "<= 1", lambda v: v <= 1),
    ("recovery", "rss_ratio_vs_jetstream", "<= 1", lambda v: v <= 1),
    ("recovery", "serves_ratio_vs_stan", "", None),
    ("recovery", "pending_redelivered_ratio_vs_stan", "", None),
    ("startup", "ours_s", "<= 0.3", lambda v: v <= 0.3),
    ("storm", "amplification_stock", "> 1", lambda v: v > 1.2),
    ("storm", "amplification_best_mitigation", "<= 1.05", lambda v: v <= 1.05),
    ("storm", "best_mitigation", "", None),
    ("wire", "publish_async_ratio_vs_jetstream", ">= 2.5", lambda v: v >= 2.5),
    ("engine", "deliver_ack_per_s", ">= 300,000", lambda v: v >= 300_000),
    ("event_log", "consume_ack_ratio_with_log", ">= 0.85", lambda v: v >= 0.85),
    ("event_log", "node_consume_ratio_observed", ">= 0.9", lambda v: v >= 0.9),
    ("bayeux", "ours_msgs_per_s", "", None),
    ("bayeux", "faye_msgs_per_s", "", None),
    ("bayeux", "throughput_ratio_vs_faye", ">= 1.0", lambda v: v >= 1.0),
    ("bayeux", "ours_p99_ms", "", None),
    ("bayeux", "p99_ratio_vs_faye", "<= 1.5", lambda v: v <= 1.5),
    ("bayeux", "ws_throughput_ratio_vs_faye", ">= 1.0", lambda v: v >= 1.0),
    ("bayeux", "ws_p99_ratio_vs_faye", "<= 1.5", lambda v: v <= 1.5),
    ("bayeux", "ws_client_ceiling_vs_faye", "", None),
    ("bayeux", "ws_durable_floor_p99_ratio_vs_faye", "", None),
    ("bayeux", "ws_p99_ratio_vs_durable_floor", "", None),
    ("rest", "ceiling_requests_per_s", "", None),
    ("rest", "pull_ack_msgs_per_s", "", None),
    ("rest", "publish_msgs_per_s", "", None),
    ("rest", "pull_ack_fraction_of_ceiling", ">= 0.4", lambda v: v >= 0.4),
]


def run_script(name: str, quick: bool, plots: Path | None, console: Console) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--json"]
    if quick:
        cmd.append("--quick")
    if name in NODE_ARGS and NODE_READY:
        cmd += NODE_ARGS[name]
    if plots is not None and name in PLOTS:
        cmd += ["--plot", str(plots / f"{name}.png")]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        console.print(f"[red]{name} failed ({done.returncode}) after {elapsed:.0f} s[/red]\n{done.stderr[-2000:]}")
        return {"error": done.returncode}
    console.print(f"{name}: {elapsed:.0f} s")
    result: dict[str, Any] = json.loads(lines[-1])
    result["elapsed_s"] = round(elapsed, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every script's --quick")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--runs", type=int, default=1, help="run the whole set this many times (default 1)")
    parser.add_argument("--only", nargs="+", choices=SCRIPTS, help="run these scripts only")
    parser.add_argument("--markdown", type=Path, help="write the table as Markdown to this file")
    parser.add_argument("--plots", type=Path, help="write the scripts' plots into this directory")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    if args.plots is not None:
        args.plots.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, dict[str, Any]]] = []
    for run in range(args.runs):
        results: dict[str, dict[str, Any]] = {}
        for name in args.only or [s for s in SCRIPTS if NODE_READY or s not in NODE_ONLY]:
            of = f" (run {run + 1} of {args.runs})" if args.runs > 1 else ""
            console.print(f"running bench/{name}.py{' --quick' if args.quick else ''}{of} ...")
            results[name] = run_script(name, args.quick, args.plots, console)
        runs.append(results)
        if args.markdown is not None:  # after every run: a long series stopped early keeps what it measured
            write_markdown(args.markdown, runs, args.quick, args.runs)
    rows = [(f"{script}: {key}", shown, target) for script, key, shown, target in headline_rows(runs)]
    title = f"all benchmarks ({'quick' if args.quick else 'full'}{f', {args.runs} runs' if args.runs > 1 else ''})"
    print_report(console, title, rows, runs[0] if args.runs == 1 else {"runs": runs}, args.json)


def write_markdown(path: Path, runs: list[dict[str, dict[str, Any]]], quick: bool, planned: int) -> None:
    """The table for bench/README.md, with the date, the machine and the command: a column per run."""
    command = "python bench/run_all.py" + (" --quick" if quick else "") + (f" --runs {planned}" if planned > 1 else "")
    machine = f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    done = f" ({len(runs)} of the {planned} runs done)" if len(runs) < planned else ""
    value = "value" if planned == 1 else " | ".join(f"run {i + 1}" for i in range(len(runs)))
    lines = [
        f"{datetime.date.today().isoformat()}, {machine}, `{command}`{done}:",
        "",
        f"| script | figure | {value} | target |",
        f"|---|---|{'---|' * len(runs)}---|",
    ]
    lines += [
        f"| {script} | `{key}` | {shown.replace(' / ', ' | ')} | {target} |"
        for script, key, shown, target in headline_rows(runs)
    ]
    path.write_text("\n".join(lines) + "\n")


def headline_rows(runs: list[dict[str, dict[str, Any]]]) -> list[tuple[str, str, str, str]]:
    """(script, figure, its value in each run joined by " / ", target with its verdict) for every
    headline of the scripts that ran. The verdict is "met" / "not met" for one run; for several, in how
    many of the runs that gave the figure the target held."""
    rows = []
    for script, key, target, check in HEADLINES:
        if script not in runs[0]:
            continue
        shown, held, judged = [], 0, 0
        for results in runs:
            value = results[script].get(key)
            if isinstance(value, float):
                value = round(value, 3)
            shown.append("failed" if "error" in results[script] else ("-" if value is None else f"{value}"))
            if check is not None and value is not None:
                judged += 1
                held += bool(check(value))
        verdict = ""
        if judged and len(runs) == 1:
            verdict = " (met)" if held else " (not met)"
        elif judged:
            verdict = f" (met in {held} of {judged})"
        rows.append((script, key, " / ".join(shown), target + verdict))
    return rows


if __name__ == "__main__":
    main()
