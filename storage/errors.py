"""The store's exceptions: one base class, and one subclass per failure a caller must tell apart."""

from __future__ import annotations


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


class TooManyChannelsError(ChannelError):
    def __init__(self) -> None:
        super().__init__("too many channels")


class UnknownChannelError(ChannelError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"stan: unknown channel {name!r}")
