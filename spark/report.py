"""What a person reads after a run: `summary.json` (the headline figures) and `report.md` with PNG
plots (redeliveries over time with storm episodes shaded, the attempt histogram, handler time
against AckWait). Everything here works on small frames collected to the driver."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or in CI
import matplotlib.pyplot as plt
from pyspark.sql import DataFrame, Row

from spark.analyses import RESTART_FIGURES

PLOT_SERIES = 6  # consumers drawn per plot, the busiest first
SCATTER_POINTS = 20_000


def rows(frame: DataFrame, limit: int | None = None) -> list[dict[str, Any]]:
    """A small frame as JSON-ready dicts (timestamps as ISO strings)."""
    collected: list[Row] = (frame.limit(limit) if limit else frame).collect()
    return [{k: _plain(v) for k, v in row.asDict().items()} for row in collected]


def _plain(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _label(row: dict[str, Any]) -> str:
    return f"{row['channel']} / {row['consumer']}"


def plot_redeliveries(
    buckets: list[dict[str, Any]], episodes: list[dict[str, Any]], path: Path, bucket_s: float
) -> None:
    series: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for b in buckets:
        series[_label(b)].append((b["bucket_start_us"] / 1e6, b["redeliveries"]))
    busiest = sorted(series, key=lambda k: -sum(n for _, n in series[k]))[:PLOT_SERIES]
    t0 = min((t for k in busiest for t, _ in series[k]), default=0.0)
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.set_xlabel("seconds since the first bucket")
    ax.set_ylabel("redeliveries per bucket")
    for name in busiest:
        points = sorted(series[name])
        points.append((points[-1][0] + bucket_s, points[-1][1]))  # so the last bucket has its width
        ax.step([t - t0 for t, _ in points], [n for _, n in points], where="post", label=name)
    for i, e in enumerate(episodes):
        ax.axvspan(
            e["start_us"] / 1e6 - t0,
            e["end_us"] / 1e6 - t0,
            color="tab:red",
            alpha=0.15,
            label="storm episode" if i == 0 else None,
        )
    _finish(fig, ax, path, "Redeliveries over time (storm episodes shaded)", legend=bool(busiest))


def _finish(fig: Any, ax: Any, path: Path, title: str, *, legend: bool) -> None:
    ax.set_title(title)
    if legend:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_attempts(attempts: list[dict[str, Any]], path: Path) -> None:
    totals: dict[int, int] = defaultdict(int)
    for a in attempts:
        totals[a["attempt"]] += a["deliveries"]
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = sorted(totals)
    ax.bar([str(k) for k in keys], [totals[k] for k in keys], color="tab:blue")
    if keys and max(totals.values()) > 100 * max(1, min(totals.values())):
        ax.set_yscale("log")
    ax.set_xlabel("delivery attempt")
    ax.set_ylabel("deliveries")
    _finish(fig, ax, path, "Attempt distribution (all consumers)", legend=False)


def plot_handler_times(handled: list[dict[str, Any]], fit: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4))
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for h in handled:
        by[_label(h)].append((h["acked_us"] / 1e6, h["handler_s"]))
    t0 = min((t for points in by.values() for t, _ in points), default=0.0)
    for name in sorted(by, key=lambda k: -len(by[k]))[:PLOT_SERIES]:
        ax.scatter([t - t0 for t, _ in by[name]], [s for _, s in by[name]], s=4, label=name)
    for i, f in enumerate(fit):
        if f["ack_wait_s"]:
            ax.axhline(f["ack_wait_s"], color="tab:red", linestyle="--", label="AckWait" if i == 0 else None)
    ax.set_xlabel("acknowledged at, seconds since the first ack")
    ax.set_ylabel("ack - first delivery, seconds")
    _finish(fig, ax, path, "Handler time (as the server sees it) against AckWait", legend=bool(by))


def recommend(episode: dict[str, Any], fit: list[dict[str, Any]]) -> str:
    """What to change so that a storm like this one does not come back, from its dominant reason and
    its consumer's AckWait fit."""
    mine = next((f for f in fit if (f["channel"], f["consumer"]) == (episode["channel"], episode["consumer"])), None)
    reason = episode.get("dominant_reason")
    if reason == "ack_timeout":
        if mine is not None and mine.get("flagged"):
            inflight = mine.get("recommended_max_inflight")
            smaller = f", or MaxInflight {inflight} or less" if inflight else ""
            return (
                f"handlers outlast AckWait (p99 {mine['handler_p99_s']:.3g} s against {mine['ack_wait_s']:g} s): "
                f"AckWait {mine['recommended_ack_wait_s']:g} s{smaller}; or have handlers send ack-progress"
            )
        return "messages outlived AckWait: raise AckWait, lower MaxInflight, or send ack-progress while working"
    if reason == "member_left":
        return "members left with messages in flight: turn on MaxInflight for redeliveries so the rest are not flooded"
    if reason in ("restart", "resume"):
        return "pending messages came back after a restart or resume: a lower MaxInflight bounds how many"
    return "look at the redelivery mix of this consumer"


def _table(records: list[dict[str, Any]], columns: list[str]) -> str:
    if not records:
        return "_none_\n"
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(_cell(r.get(c)) for c in columns) + " |\n" for r in records)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def write(out: Path, summary: dict[str, Any], plots: dict[str, str]) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    bad = summary["bad_lines"]
    lines = [
        "# Redelivery-storm report",
        "",
        f"Input: {', '.join(summary['input'])}; {summary['events']:,} events, "
        f"{summary['first_event']} to {summary['last_event']} (UTC). "
        f"Bad lines: {bad['malformed']} malformed, {bad['unknown_event']} of unknown kinds, "
        f"{bad['invalid']} missing required fields (counted, not used).",
        "",
        "## Storm episodes",
        "",
        f"A {summary['settings']['bucket_s']:g} s bucket is hot when its redeliveries exceed "
        f"{summary['settings']['storm_k']:g} x the median of the "
        f"{summary['settings']['storm_baseline_buckets']} latest calm buckets before it (and "
        f"{summary['settings']['storm_min_redeliveries']}): hot buckets never join that baseline, so a storm is "
        "measured against the traffic from before it however long it lasts. An episode is "
        f"{summary['settings']['storm_min_buckets']} or more hot buckets in a row; a bucket with no delivery "
        "at all (a restart) carries an episode on. Its cause: a fault-tolerance `takeover` or a `restart` "
        "shortly before or during it, else `member left` or `slow consumer` (AckWait ran out) from its "
        "redeliveries.",
        "",
        _table(
            summary["storm_episodes"],
            [
                "channel",
                "consumer",
                "start",
                "end",
                "peak_redeliveries",
                "redeliveries",
                "amplification",
                "cause",
                "dominant_reason",
                "recommendation",
            ],
        ),
        f"![redeliveries over time]({plots['redeliveries']})",
        "",
        "## Amplification (deliveries / distinct messages delivered), whole log",
        "",
        _table(
            summary["amplification"], ["channel", "consumer", "deliveries", "messages", "redeliveries", "amplification"]
        ),
        "## AckWait fit",
        "",
        _table(
            summary["ack_wait_fit"],
            [
                "channel",
                "consumer",
                "handler_p50_s",
                "handler_p99_s",
                "ack_wait_s",
                "late_ack_fraction",
                "flagged",
                "recommended_ack_wait_s",
                "recommended_max_inflight",
            ],
        ),
        "Handler time is the ack minus the message's first delivery, as the server sees it, so it "
        "includes the time a message "
        "waited in the client behind the others in flight. A flagged consumer avoids the storm with "
        "either the recommended AckWait, or a MaxInflight no larger than recommended (one member's "
        "service time x MaxInflight under AckWait).",
        "",
        f"![handler time against AckWait]({plots['handler_times']})",
        "",
        "## Attempts and poison candidates",
        "",
        f"![attempt histogram]({plots['attempts']})",
        "",
        f"{summary['poison_candidates']} poison candidates (attempts >= {summary['settings']['poison_attempts']}, "
        "or never acknowledged although the last AckWait ran out); first ones:",
        "",
        _table(summary["poison_examples"], ["channel", "consumer", "seq", "attempts", "acked", "why"]),
        f"## Status at the end of the log (Burrow-style, last {summary['settings']['status_samples']} samples)",
        "",
        _table(summary["status"], ["channel", "consumer", "lag", "status"]),
        "## Queue-member skew (the most uneven windows)",
        "",
        _table(
            summary["member_skew_worst"],
            ["channel", "consumer", "window_start", "members", "max_over_mean", "cv", "top_redelivery_share"],
        ),
        "## Member-leave bursts",
        "",
        _table(
            summary["leave_bursts"],
            [
                "channel",
                "consumer",
                "left_member",
                "left_at",
                "redelivered",
                "to_members",
                "last_redelivery_s",
                "drain_s",
            ],
        ),
        "## Restarts",
        "",
        _table(summary["restarts"], ["started_at", *RESTART_FIGURES]),
        f"Analysed in {summary['seconds']:.1f} s. Parquet per analysis in this directory.",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
