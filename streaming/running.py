"""What a running server is made of, for monitoring and for tests that want more than the port."""

from __future__ import annotations

import attrs

from storage import Store
from streaming.bayeux.door import BayeuxDoor
from streaming.core.service import Core
from streaming.event_log import EventLog
from streaming.pull.door import PullDoor
from streaming.stan.broker import Broker
from streaming.stan.server import StanServer


@attrs.define
class Running:
    """What `serve` hands to `task_status.started`."""

    port: int
    broker: Broker
    core: Core
    stan: StanServer
    store: Store
    http_port: int = 0  # the monitoring port, when one is served
    event_log: EventLog | None = None
    bayeux: BayeuxDoor | None = None  # the Bayeux door, when the HTTP client port is on
    pull: PullDoor | None = None  # the HTTP pull door, likewise
    http_api_port: int = 0  # the HTTP client port (Bayeux), when one is served
