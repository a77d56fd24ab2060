"""What a running server is made of, for monitoring and for tests that want more than the port."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from storage import Store
from streaming.core.door_api import DoorApi
from streaming.core.service import Core
from streaming.ft.status import FtStatus
from streaming.nats.broker import Broker
from streaming.nats.bus import Bus
from streaming.observability.event_log import EventLog
from streaming.stan.door import StanDoor
from streaming.stan.partitions import Partition

if TYPE_CHECKING:  # loaded only by a server that serves them
    from streaming.bayeux.door import BayeuxDoor
    from streaming.pull.door import PullDoor


@attrs.define
class Running:
    """What `serve` hands to `task_status.started`."""

    port: int  # the embedded broker's (0 with an external NATS cluster)
    bus: Bus  # the embedded broker, or the link to an external NATS cluster
    core: Core
    api: DoorApi  # what the front doors use of the core
    stan: StanDoor
    store: Store
    http_port: int = 0  # the monitoring port, when one is served
    event_log: EventLog | None = None
    bayeux: BayeuxDoor | None = None  # the Bayeux door, when the HTTP client port is on
    pull: PullDoor | None = None  # the HTTP pull door, likewise
    http_api_port: int = 0  # the HTTP client port (Bayeux), when one is served
    server_name: str = "streaming-server"
    partition: Partition | None = None  # the channels it owns, when partitioned
    ft: FtStatus | None = None  # where it stands in its fault-tolerance group, when it is in one

    @property
    def broker(self) -> Broker:
        """The embedded broker (for tests of it; monitoring uses `bus`)."""
        assert isinstance(self.bus, Broker), "this server is attached to an external NATS cluster"
        return self.bus
