"""A member logs in to a cluster that asks for credentials as the server's link does: the group's log
and lease go through the same login (a token, an nkey seed)."""

from __future__ import annotations

import os
from pathlib import Path

import nkeys
import pytest

from bench.peers import nats_cluster
from tests.support.ft import member, the_active


@pytest.mark.slow
@pytest.mark.parametrize("how", ["token", "nkey seed"])
def test_a_member_serves_on_a_cluster_that_asks_for_credentials(how: str, tmp_path: Path) -> None:
    if how == "token":
        authorization = 'authorization { token: "s3cret" }'
        login = ["--nats_token", "s3cret"]
    else:
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        public = nkeys.from_seed(bytearray(seed)).public_key.decode()
        (tmp_path / "user.nk").write_bytes(seed)
        authorization = f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}'
        login = ["--nats_nkey_seed", str(tmp_path / "user.nk")]
    with nats_cluster(1, extra=authorization, jetstream=True) as nodes:
        solo = member("solo", nodes, tmp_path, replicas=1, login=login).start()
        try:
            page = the_active([solo]).serverz()
            assert page is not None and page["ft_epoch"] == 1 and page["ft_applied"] >= 2  # genesis, epoch
        finally:
            solo.process.stop()
