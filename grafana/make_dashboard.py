"""Writes grafana/dashboards/streaming.json, the Grafana dashboard of the server's metrics.

    python grafana/make_dashboard.py

The dashboard is generated so that its panels stay regular (every panel has a unit, every rate() uses
`$__rate_interval`, every expression filters by the `channel`/`group` variables where it can); the
tests check the JSON written here against a real scrape and a real Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "streaming.json"
CG = 'channel=~"$channel",group=~"$group"'
C = 'channel=~"$channel"'
RI = "[$__rate_interval]"

# (row title, [(panel title, type, unit, [(expr, legend)])])
ROWS: list[tuple[str, list[tuple[str, str, str, list[tuple[str, str]]]]]] = [
    (
        "Overview",
        [
            ("Clients", "stat", "none", [("sum(streaming_clients)", "clients")]),
            ("Subscriptions", "stat", "none", [("sum by (state) (streaming_subscriptions)", "{{state}}")]),
            ("Channels", "stat", "none", [("sum(streaming_channels)", "channels")]),
            ("Connections", "stat", "none", [("sum(streaming_connections)", "connections")]),
            ("Server version", "stat", "none", [("max by (version) (streaming_build_info)", "{{version}}")]),
        ],
    ),
    (
        "Throughput",
        [
            (
                "Published messages/s",
                "timeseries",
                "ops",
                [(f"sum by (channel) (rate(streaming_published_messages_total{{{C}}}{RI}))", "{{channel}}")],
            ),
            (
                "Published bytes/s",
                "timeseries",
                "Bps",
                [(f"sum by (channel) (rate(streaming_published_bytes_total{{{C}}}{RI}))", "{{channel}}")],
            ),
            (
                "Deliveries/s by reason",
                "timeseries",
                "ops",
                [(f"sum by (reason) (rate(streaming_deliveries_total{{{CG}}}{RI}))", "{{reason}}")],
            ),
            (
                "Acks/s",
                "timeseries",
                "ops",
                [(f"sum by (channel, group) (rate(streaming_acks_total{{{CG}}}{RI}))", "{{channel}} {{group}}")],
            ),
        ],
    ),
    (
        "Redelivery",
        [
            (
                "Redeliveries/s by reason",
                "timeseries",
                "ops",
                [(f'sum by (reason) (rate(streaming_deliveries_total{{{CG},reason!="new"}}{RI}))', "{{reason}}")],
            ),
            (
                "Redelivered share of deliveries",
                "timeseries",
                "percentunit",
                [
                    (
                        f'sum(rate(streaming_deliveries_total{{{CG},reason!="new"}}{RI}))'
                        f" / clamp_min(sum(rate(streaming_deliveries_total{{{CG}}}{RI})), 1e-9)",
                        "redelivered",
                    )
                ],
            ),
            (
                "AckWait expiries/s",
                "timeseries",
                "ops",
                [
                    (
                        f"sum by (channel, group) (rate(streaming_ack_timeouts_total{{{CG}}}{RI}))",
                        "{{channel}} {{group}}",
                    )
                ],
            ),
            (
                "Dead-lettered",
                "timeseries",
                "short",
                [
                    (
                        f"sum by (channel, group) (increase(streaming_dead_lettered_total{{{CG}}}{RI}))",
                        "{{channel}} {{group}}",
                    )
                ],
            ),
            (
                "Delivery attempt p99",
                "timeseries",
                "short",
                [
                    (
                        f"histogram_quantile(0.99, sum by (le) (rate(streaming_delivery_attempt_bucket{{{CG}}}{RI})))",
                        "p99 attempt",
                    )
                ],
            ),
        ],
    ),
    (
        "Ack latency vs AckWait",
        [
            (
                "Ack latency p50 / p99 and AckWait",
                "timeseries",
                "s",
                [
                    (
                        "histogram_quantile(0.5, sum by (le, channel, group) "
                        f"(rate(streaming_ack_latency_seconds_bucket{{{CG}}}{RI})))",
                        "p50 {{channel}} {{group}}",
                    ),
                    (
                        "histogram_quantile(0.99, sum by (le, channel, group) "
                        f"(rate(streaming_ack_latency_seconds_bucket{{{CG}}}{RI})))",
                        "p99 {{channel}} {{group}}",
                    ),
                    (f"max by (channel, group) (streaming_ack_wait_seconds{{{CG}}})", "AckWait {{channel}} {{group}}"),
                ],
            ),
            (
                "Ack pending",
                "timeseries",
                "short",
                [(f"sum by (channel, group) (streaming_ack_pending_messages{{{CG}}})", "{{channel}} {{group}}")],
            ),
        ],
    ),
    (
        "Queue groups",
        [
            (
                "Members joining / leaving",
                "timeseries",
                "short",
                [
                    (
                        f"sum by (group, change) (increase(streaming_queue_member_changes_total{{{CG}}}{RI}))",
                        "{{group}} {{change}}",
                    )
                ],
            ),
            (
                "Redeliveries after a member left",
                "timeseries",
                "ops",
                [
                    (
                        f'sum by (group) (rate(streaming_deliveries_total{{{CG},reason="member_left"}}{RI}))',
                        "{{group}}",
                    )
                ],
            ),
            (
                "Deliveries/s per group",
                "timeseries",
                "ops",
                [(f"sum by (group) (rate(streaming_deliveries_total{{{CG}}}{RI}))", "{{group}}")],
            ),
            (
                "Stalled subscriptions (at MaxInflight)",
                "timeseries",
                "short",
                [(f"sum by (channel, group) (streaming_stalled_subscriptions{{{CG}}})", "{{channel}} {{group}}")],
            ),
        ],
    ),
    (
        "Storage",
        [
            (
                "Messages stored",
                "timeseries",
                "short",
                [(f"sum by (channel) (streaming_channel_messages{{{C}}})", "{{channel}}")],
            ),
            (
                "Bytes stored",
                "timeseries",
                "bytes",
                [(f"sum by (channel) (streaming_channel_bytes{{{C}}})", "{{channel}}")],
            ),
            (
                "Last sequence",
                "timeseries",
                "short",
                [(f"max by (channel) (streaming_channel_last_sequence{{{C}}})", "{{channel}}")],
            ),
            (
                "Store used / map size",
                "timeseries",
                "percentunit",
                [("streaming_store_used_bytes / streaming_store_map_size_bytes", "{{env}}")],
            ),
            (
                "Store takes writes (0: disk full, served from memory) / damaged messages found",
                "timeseries",
                "short",
                [
                    ('streaming_store_writable{job=~"$job"}', "writable"),
                    ('streaming_store_damaged_messages{job=~"$job"}', "damaged messages"),
                ],
            ),
            (
                "Group commit p99",
                "timeseries",
                "s",
                [
                    (
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate(streaming_store_commit_duration_seconds_bucket{RI})))",
                        "p99 commit",
                    )
                ],
            ),
        ],
    ),
    (
        "Bayeux (HTTP clients)",
        [
            (
                "Sessions / held connects",
                "timeseries",
                "short",
                [
                    ('streaming_bayeux_sessions{job=~"$job"}', "sessions"),
                    ('streaming_bayeux_held_connects{job=~"$job"}', "held connects"),
                ],
            ),
            (
                "Messages out by batch / sent again/s",
                "timeseries",
                "ops",
                [
                    (f"sum(rate(streaming_bayeux_delivered_messages_total{RI}))", "written into replies"),
                    (f"sum(rate(streaming_bayeux_resent_messages_total{RI}))", "sent again (batch not acknowledged)"),
                ],
            ),
            (
                "Queued in sessions / expiries",
                "timeseries",
                "short",
                [
                    ('streaming_bayeux_queued_messages{job=~"$job"}', "queued or unacknowledged"),
                    (f"sum(increase(streaming_bayeux_expired_sessions_total{RI}))", "sessions expired"),
                ],
            ),
        ],
    ),
    (
        "FT group",
        [
            (
                "Active member (1) and standbys (0)",
                "timeseries",
                "short",
                [('streaming_ft_active{job=~"$job"}', "{{instance}}")],
            ),
            ("Epoch", "timeseries", "short", [('max(streaming_ft_epoch{job=~"$job"})', "epoch")]),
            (
                "Standby lag (log records)",
                "timeseries",
                "short",
                [('streaming_ft_lag_records{job=~"$job"}', "{{instance}}")],
            ),
            ("Takeovers", "timeseries", "short", [(f"sum(increase(streaming_ft_takeovers_total{RI}))", "takeovers")]),
        ],
    ),
    (
        "Process",
        [
            ("CPU", "timeseries", "percentunit", [(f'rate(process_cpu_seconds_total{{job=~"$job"}}{RI})', "cpu")]),
            ("Resident memory", "timeseries", "bytes", [('process_resident_memory_bytes{job=~"$job"}', "rss")]),
            ("Open file descriptors", "timeseries", "short", [('process_open_fds{job=~"$job"}', "fds")]),
            (
                "Slow-consumer disconnects",
                "timeseries",
                "short",
                [(f"sum(increase(streaming_slow_consumer_disconnects_total{RI}))", "disconnects")],
            ),
            (
                "Protocol errors by kind",
                "timeseries",
                "short",
                [(f"sum by (kind) (increase(streaming_protocol_errors_total{RI}))", "{{kind}}")],
            ),
        ],
    ),
]


def _query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    next_id = 1
    y = 0
    for row_title, row_panels in ROWS:
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        next_id += 1
        y += 1
        width = 24 // len(row_panels) if row_panels[0][1] == "stat" else 8
        height = 4 if row_panels[0][1] == "stat" else 8
        for i, (title, kind, unit, targets) in enumerate(row_panels):
            x = (i * width) % 24
            if i and x == 0:
                y += height
            panels.append(
                {
                    "id": next_id,
                    "type": kind,
                    "title": title,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"h": height, "w": width, "x": x, "y": y},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
                    if kind == "timeseries"
                    else {},
                    "targets": [
                        {
                            "refId": chr(ord("A") + n),
                            "datasource": {"type": "prometheus", "uid": "${datasource}"},
                            "expr": expr,
                            "legendFormat": legend,
                        }
                        for n, (expr, legend) in enumerate(targets)
                    ],
                }
            )
            next_id += 1
        y += height
    return {
        "uid": "streaming-server",
        "title": "streaming-server",
        "description": "Durable subscription server (NATS Streaming protocol): throughput, redelivery, acks, "
        "queue groups, storage",
        "tags": ["streaming", "nats-streaming"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _query_variable("job", "Job", "label_values(streaming_build_info, job)"),
                _query_variable("channel", "Channel", "label_values(streaming_channel_messages, channel)"),
                _query_variable(
                    "group", "Group", 'label_values(streaming_deliveries_total{channel=~"$channel"}, group)'
                ),
            ]
        },
        "panels": panels,
    }


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
