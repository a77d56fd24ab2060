"""What a fault-tolerance group needs, said at start rather than found out later."""

from __future__ import annotations

import pytest

from streaming.config import ConfigError, ServerConfig

CLUSTER = "nats://127.0.0.1:4222"


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"ft_group": "main"}, "ft_group needs nats_server"),
        ({"ft_group": "main", "nats_server": CLUSTER, "store": "memory"}, "needs the lmdb store"),
        ({"ft_group": "main", "nats_server": CLUSTER, "ft_replicas": 0}, "ft_replicas must be 1 to 5"),
        ({"ft_group": "main", "nats_server": CLUSTER, "ft_replicas": 7}, "ft_replicas must be 1 to 5"),
        ({"ft_group": "main", "nats_server": CLUSTER, "ft_lease": 0.1}, "ft_lease must be at least 0.5s"),
    ],
)
def test_a_group_member_that_cannot_work_is_refused_with_the_reason(values: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        ServerConfig(**values)  # type: ignore[arg-type]


def test_a_member_of_a_group_is_configured_by_its_flags() -> None:
    config = ServerConfig(ft_group="main", nats_server=CLUSTER, ft_replicas=1, ft_lease=3.0)  # type: ignore[arg-type]
    assert (config.ft_group, config.ft_replicas, config.ft_lease) == ("main", 1, 3.0)
