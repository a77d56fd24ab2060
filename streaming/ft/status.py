"""Where a member of a fault-tolerance group stands, as monitoring and metrics show it (STAN's words
for the states: FT_ACTIVE, FT_STANDBY)."""

from __future__ import annotations

import attrs

ACTIVE = "FT_ACTIVE"
STANDBY = "FT_STANDBY"


class GroupError(Exception):
    """This member cannot join its group as it is (its data directory holds another log's data, the
    group's stream cannot be made); str() says why and what to do."""


@attrs.define
class FtStatus:
    group: str
    member: str  # this process's name in the lease: the server name and a random suffix
    state: str = STANDBY
    epoch: int = 0  # the active's epoch, as this member last saw it
    active_member: str = ""
    applied: int = 0  # the last log record this member's store holds
    log_last: int = 0  # the log's last record, as last seen
    takeovers: int = 0  # times this member became the active

    @property
    def lag(self) -> int:
        """Log records this member's store does not hold yet (0 for the active)."""
        return max(self.log_last - self.applied, 0)

    def as_json(self) -> dict[str, object]:
        return {
            "ft_group": self.group,
            "ft_member": self.member,
            "ft_epoch": self.epoch,
            "ft_active": self.active_member,
            "ft_applied": self.applied,
            "ft_lag": self.lag,
        }
