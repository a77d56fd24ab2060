"""Reading the Grafana dashboard's panel expressions, for the dashboard and Prometheus tests."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "streaming.json"
METRIC = re.compile(r"\b((?:streaming|process)_[a-z_]+)\b")
# What Grafana puts in for the variables when everything is selected.
VARIABLES = {"$channel": ".*", "$group": ".*", "$job": "streaming", "$__rate_interval": "30s"}


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels(dashboard) for t in p["targets"]]


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))
