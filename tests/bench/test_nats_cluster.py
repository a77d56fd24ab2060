"""`bench.peers.nats_cluster`: a node that exits while its cluster starts (a port chosen free, taken
before it bound it) is started again, with every node on fresh ports."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from bench import peers


def test_a_node_whose_cluster_port_was_taken_is_started_again_on_fresh_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        real = peers.free_port
        # The second port chosen is the first node's cluster port: it gets one a socket here holds.
        ports: Iterator[int] = iter([real(), busy])
        monkeypatch.setattr(peers, "free_port", lambda: next(ports, None) or real())
        with peers.nats_cluster(2) as nodes:
            assert busy not in [port for n in nodes for port in (n.port, n.cluster_port)]
            assert all(n.proc is not None and n.proc.poll() is None for n in nodes)
            logs = [n.log.read_text(errors="replace") for n in nodes]
            assert all("Route connection created" in text for text in logs)
