"""Bayeux traffic in the Prometheus metrics and the delivery event log, like every other door's."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streaming.observability.event_schema import problems
from tests.bayeux.harness import bayeux_config, raw_client
from tests.observability.test_event_log import read_events
from tests.support.servers import running

pytestmark = pytest.mark.slow


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_bayeux_sessions_batches_deliveries_and_acks_are_measured_and_logged(tmp_path: Path) -> None:
    log_dir = tmp_path / "events"
    cfg = bayeux_config(tmp_path / "data", http_port=-1, event_log=str(log_dir))
    async with running(cfg) as server:
        async with raw_client(server.http_api_port) as sub, raw_client(server.http_api_port) as pub:
            await sub.handshake()
            await sub.connect(0, now=True)
            await sub.subscribe("/seen/a")
            await pub.handshake()
            for n in range(3):
                await pub.publish("/seen/a", n)
            deliveries, _ = await sub.connect(1)
            assert len(deliveries) == 3
            await pub.publish("/seen/a", 3)
            deliveries, _ = await sub.connect(1)  # the reply of batch 2 "was lost": all four go out
            assert len(deliveries) == 4
            await sub.connect(3, now=True)  # acknowledges them
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
                text = (await http.get("/metrics")).text
                pages = [(await http.get(page)).text for page in ("/streaming/channelsz?subs=1", "/streaming/clientsz")]
            assert "_BAYEUX." in pages[0] and "bayeux:" in pages[0], "the subscriptions are on the page"
            secrets = (sub.client_id, pub.client_id)
            assert not [s for s in secrets for page in [text, *pages] if s in page], "a session's credential shown"
            values = samples(text)
            assert values[("streaming_bayeux_sessions", ())] == 2
            assert values[("streaming_bayeux_handshakes_total", ())] == 2
            assert values[("streaming_bayeux_published_messages_total", ())] == 4
            assert values[("streaming_bayeux_delivered_messages_total", ())] == 7
            assert values[("streaming_bayeux_resent_messages_total", ())] == 3
            assert values[("streaming_bayeux_batches_total", ())] == 4
            delivered = [v for (name, labels), v in values.items() if name == "streaming_deliveries_total"]
            assert sum(delivered) == 4, "engine deliveries: each message once, resends are the door's"
            acks = [v for (name, labels), v in values.items() if name == "streaming_acks_total"]
            assert sum(acks) == 4
    events = read_events(log_dir)
    assert not [e for e in events if problems(e)]
    mine = [e for e in events if e["channel"] == "seen.a"]
    assert [e["event"] for e in mine if e["event"] == "publish"] == ["publish"] * 4
    deliver = [e for e in mine if e["event"] == "deliver"]
    acked = [e for e in mine if e["event"] == "ack"]
    assert [e["seq"] for e in deliver] == [1, 2, 3, 4] and sorted(e["seq"] for e in acked) == [1, 2, 3, 4]
    assert all(e["member"].startswith("bayeux:") for e in deliver + acked)
    assert not [e for e in events if any(s in json.dumps(e) for s in secrets)]
