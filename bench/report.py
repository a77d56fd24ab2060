"""How every benchmark reports: a table for people (rich) and, with --json, one JSON object as the
last line for scripts (bench/run_all.py, CI jobs)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from rich.console import Console
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
