"""The store's exceptions: one base class, and one subclass per failure a caller must tell apart."""

from __future__ import annotations

import os
from pathlib import Path

_LOW_DISK_BYTES = 64 << 20


class StoreError(Exception):
    """Base class of every error raised by a store."""


class StoreLockedError(StoreError):
    """Another process holds the data directory."""


class ClusterIdMismatchError(StoreError):
    def __init__(self, configured: str, recovered: str, path: str) -> None:
        self.configured = configured
        self.recovered = recovered
        super().__init__(
            f'cluster ID "{configured}" does not match recovered value of "{recovered}" (data directory {path})'
        )


class SchemaVersionError(StoreError):
    """The data directory was written by a newer version of the server."""


class IntegrityError(StoreError):
    """A stored value failed its integrity check, or the LMDB file itself is damaged."""


class DamagedStoreError(IntegrityError):
    """The data directory is damaged or incomplete, so the store refuses to open it as it is: what it
    holds may no longer be what was acknowledged. str() names the file and what is wrong."""


class DamageFoundError(DamagedStoreError):
    """Damage that the full check, run while the store already served (`Store.check_fully`), found:
    the server stops as it would have refused to start. str() names the file and what is wrong."""


class StoreWriteError(StoreError):
    """A write to disk failed; the batch is not stored and nothing committed before is affected."""


class StoreFullError(StoreWriteError):
    """The disk (or the configured maximum map size) is full; nothing committed is affected."""


class ChannelError(StoreError):
    """A channel cannot be created or used; str() is the text a STAN client is shown."""


class ChannelNameConflictError(ChannelError):
    def __init__(self, requested: str, existing: str) -> None:
        self.requested = requested
        self.existing = existing
        # The misspelling "alreay" is the reference server's exact text; clients may match it.
        super().__init__(
            f'rejecting channel "{requested}" because channel "{existing}" alreay exists (different cases not allowed)'
        )


class NameTooLongError(ChannelError):
    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"stan: {what} longer than {limit} bytes")


class TooManyChannelsError(ChannelError):
    def __init__(self) -> None:
        super().__init__("too many channels")


class UnknownChannelError(ChannelError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"stan: unknown channel {name!r}")


def write_failed(path: Path, exc: Exception) -> StoreWriteError:
    """The error for a failed write under `path`: StoreFullError when the disk is (nearly) full."""
    try:
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = -1
    # A short write is often reported as EIO, so the disk's free space is what tells "full" apart.
    if 0 <= free < _LOW_DISK_BYTES:
        return StoreFullError(
            f"{path}: disk full ({free} bytes free): the write failed ({exc}); everything committed before is intact"
        )
    return StoreWriteError(
        f"{path}: the write failed ({exc}; {free} bytes free on that filesystem); everything committed before is intact"
    )
