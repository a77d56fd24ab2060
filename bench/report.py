"""How every benchmark reports: a table for people (rich) and, with --json, one JSON object as the
last line for scripts (bench/run_all.py, CI jobs)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def print_report(
    console: Console, title: str, rows: Iterable[tuple[str, str, str]], result: dict[str, Any], as_json: bool
) -> None:
    """`rows` are (figure, value, target); the JSON line goes to stdout, the table to `console`."""
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if as_json:
        print(json.dumps(result))


def progress(console: Console) -> Progress:
    """The progress bar a long benchmark shows (on the table's console, so --json keeps stdout clean)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def bar_plot(path: str, title: str, ylabel: str, groups: dict[str, dict[str, float]], *, log: bool = False) -> None:
    """Grouped bars: one group per case (`groups` keys), one bar per system in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(s for values in groups.values() for s in values))
    width = 0.8 / max(len(systems), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups)), 4.0))
    for i, system in enumerate(systems):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [values.get(system, 0.0) for values in groups.values()], width, label=system)
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(groups))], list(groups))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def spread_ms(name: str, values_ms: Iterable[float]) -> dict[str, float]:
    """`<name>_p50_ms`, `_p99_ms` and `_max_ms` of some milliseconds, to 0.01 ms (NaN when there are none)."""
    ms = sorted(values_ms) or [float("nan")]
    return {
        f"{name}_p50_ms": round(statistics.median(ms), 2),
        f"{name}_p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        f"{name}_max_ms": round(ms[-1], 2),
    }


def machine() -> str:
    """The machine a figure comes from, as every result records it."""
    return f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}"


def arguments(doc: str | None, quick: str, plot: str | None = None) -> argparse.ArgumentParser:
    """The options every benchmark takes (`--quick`, `--json`, and `--plot` where it draws one)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    if plot is not None:
        parser.add_argument("--plot", metavar="FILE.png", help=plot)
    return parser
