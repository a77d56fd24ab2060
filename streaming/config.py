"""Server configuration: attrs classes, loaded from TOML with cattrs (unknown keys rejected, with the
path of the offending key in the error), then overridden by command-line flags.

Durations are seconds, or strings with a unit as nats-streaming-server writes them ("30s", "1m30s",
"24h", "500ms"). Sizes are bytes, or strings such as "64MB", "1GiB".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn
from cattrs.v import format_exception

from storage import VERIFY_MODES, ChannelLimits, StoreLimits
from streaming.security.auth import Authenticator, User
from streaming.security.origins import OriginError, Origins
from streaming.security.permissions import Permissions, Rule
from streaming.security.tls import TlsFiles
from streaming.units import Duration, Size, parse_bool, parse_duration, parse_size
from streaming.wire.urls import parse_urls


class ConfigError(Exception):
    """A configuration the server cannot start with; str() says which key and why."""


@attrs.frozen
class LimitsConfig:
    """Channel limits; global values: 0 = unlimited. Per channel: 0 = inherit, negative = unlimited."""

    max_msgs: int = 1_000_000
    max_bytes: Size = Size(1_000_000 * 1024)
    max_age: Duration = Duration(0.0)
    max_inactivity: Duration = Duration(0.0)


@attrs.frozen
class PermissionsConfig:
    """What a user may publish and subscribe to: each a list of allowed subjects, or a table with
    `allow` and `deny` lists (nats-server's shape). STAN publishes and subscriptions are checked
    against their channel."""

    publish: Rule = attrs.Factory(Rule)
    subscribe: Rule = attrs.Factory(Rule)


@attrs.frozen
class UserConfig:
    """One user of the NATS port: `password` is the password or its bcrypt hash ($2a$/$2b$/$2y$)."""

    user: str = ""
    password: str = ""
    nkey: str = ""  # instead of user and password: the user's public nkey (U...)
    permissions: PermissionsConfig | None = None


@attrs.frozen
class ChannelConfig:
    max_msgs: int = 0
    max_bytes: Size = Size(0)
    max_age: Duration = Duration(0.0)
    max_inactivity: Duration = Duration(0.0)


_POSITIVE_DURATIONS = (
    "hb_interval",
    "hb_timeout",
    "dup_check_timeout",
    "ping_interval",
    "write_deadline",
    "sync_interval",
)


@attrs.frozen
class ServerConfig:
    cluster_id: str = "test-cluster"
    host: str = "0.0.0.0"
    port: int = 4222
    http_port: int = 0  # monitoring: 0 = off, -1 = any free port (tests), as nats-server's RANDOM_PORT
    http_host: str = ""  # the monitoring port's interface; empty: the same as `host`
    store: str = "lmdb"
    dir: str = "streaming-data"
    # As nats-streaming-server's flag: false = no fsync per commit, a flush every sync_interval instead
    # (a machine crash loses up to that much, and can damage the store; a crash of the process loses nothing).
    file_sync: bool = True
    sync_interval: Duration = Duration(1.0)
    # What the lmdb store checks: "full" (every message's checksum and both files' structure, before
    # serving), "background" (what "quick" checks before serving, the rest of "full" while it serves:
    # damage stops the server) or "quick" (other damage is found when read, or by `streaming-server check`).
    verify_on_start: str = "background"
    max_channels: int = 100
    max_subs: int = 1000
    limits: LimitsConfig = LimitsConfig()
    channels: dict[str, ChannelConfig] = attrs.Factory(dict)
    discover_prefix: str = "_STAN.discover"
    hb_interval: Duration = Duration(30.0)
    hb_timeout: Duration = Duration(10.0)
    hb_fail_count: int = 10
    dup_check_timeout: Duration = Duration(0.5)
    # Subscriptions to a pattern (`orders.*`) over every matching channel: our extension, which
    # nats-streaming-server refuses ("invalid subject"); false refuses them the same way.
    wildcard_subscriptions: bool = True
    recovery_hold: Duration = Duration(5.0)  # how long a restart waits for clients to come back
    max_payload: Size = Size(1024 * 1024)
    max_pending: Size = Size(64 * 1024 * 1024)
    write_deadline: Duration = Duration(10.0)
    ping_interval: Duration = Duration(120.0)
    max_pings_out: int = 2
    connect_timeout: Duration = Duration(2.0)  # a connection must send CONNECT this soon (0: no limit)
    # Authentication on the NATS port, as nats-server's: a token, or users (one from the flags, any
    # number in [[users]]); none of them: anyone may connect.
    auth_token: str = ""
    user: str = ""
    password: str = ""
    users: list[UserConfig] = attrs.Factory(list)
    # TLS on the NATS port and the HTTP listeners, as nats-server's flags: `tls_verify` also requires
    # client certificates signed by `tls_ca_cert`.
    tls: bool = False
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca_cert: str = ""
    tls_verify: bool = False
    # An external NATS server or cluster instead of the embedded broker (comma-separated URLs, credentials
    # allowed in them), as nats-streaming-server's `nats_server_url`; and how this server logs in there.
    nats_server: str = ""
    nats_user: str = ""
    nats_password: str = ""
    nats_token: str = ""
    nats_nkey_seed: str = ""  # a file holding the user's nkey seed (SU...)
    nats_creds: str = ""  # a credentials file (user JWT and seed, as `nsc` writes them)
    tls_client_cert: str = ""  # a client certificate (PEM) for a cluster that requires TLS, and its key
    tls_client_key: str = ""
    tls_client_cacert: str = ""  # the CAs that sign the cluster's certificates (default: the system's)
    # With nats_server: own only the channels [channels] names (wildcards allowed), beside other
    # servers with the same cluster ID that own the rest (docs/scale-out.md).
    partitioning: bool = False
    # With nats_server: own partition INDEX of COUNT ("3/12") of the channel-name hash that the local
    # nats-server of `--workers` maps publishes by, instead of [channels] (set by `--workers`).
    hash_partition: str = ""
    # With nats_server: a fault-tolerance group of this name (docs/high-availability.md): one member
    # active, the others standbys, sharing a log replicated `ft_replicas` times in JetStream; a member
    # whose lease goes `ft_lease` without renewal is replaced.
    ft_group: str = ""
    ft_replicas: int = 3
    ft_lease: Duration = Duration(2.0)
    server_name: str = "streaming-server"  # in monitoring, metrics and partition conflicts
    allow_ms_ack_wait: bool = False  # test-only: a negative ackWaitInSecs means milliseconds
    log_level: str = "info"
    event_log: str = ""  # directory for the delivery event log (JSON Lines); empty = off
    event_log_rotate: Size = Size(64 * 1024 * 1024)  # start a new file past this size
    # The client-facing HTTP listener (the Bayeux/CometD endpoint): 0 = off, -1 = any free port.
    http_api_port: int = 0
    http_api_host: str = ""  # empty: the same as `host`
    http_api_max_body: Size = Size(1024 * 1024)  # larger request bodies are refused (413)
    # Pages of these origins may call it (CORS) and open its WebSockets; ["*"]: any page, no credentials.
    http_api_allow_origins: list[str] = attrs.Factory(list)
    http_api_ws_compression: bool = False  # accept permessage-deflate on WebSocket upgrades
    bayeux_path: str = "/cometd"
    bayeux_timeout: Duration = Duration(30.0)  # longest a /meta/connect with nothing to deliver is held
    bayeux_interval: Duration = Duration(0.0)  # the pause advised between a connect reply and the next
    bayeux_max_interval: Duration = Duration(10.0)  # a session with no connect this long expires
    bayeux_max_unacked: int = 1024  # per subscription: messages sent and not acknowledged by batch
    pull_max_wait: Duration = Duration(30.0)  # the longest a pull blocks (Accept-Wait, Prefer: wait=)
    pull_tombstone_ttl: Duration = Duration(3600.0)  # an expired or deleted consumer is remembered this long
    pull_ack_replay_window: Duration = Duration(600.0)  # a settled ack is answered again this long
    pull_ack_replay: str = "204"  # "405": answer a repeated ack as REST-* POST-once-exactly does
    pull_msg_headers: bool = False  # also give every link as an Artemis REST `msg-*` header

    def __attrs_post_init__(self) -> None:
        if self.store not in ("lmdb", "memory"):
            raise ConfigError(f"store: expected 'lmdb' or 'memory', got {self.store!r}")
        if self.verify_on_start not in VERIFY_MODES:
            modes = ", ".join(repr(mode) for mode in VERIFY_MODES)
            raise ConfigError(f"verify_on_start: expected one of {modes}, got {self.verify_on_start!r}")
        if not 0 <= self.port < 65536 or not -1 <= self.http_port < 65536 or not -1 <= self.http_api_port < 65536:
            raise ConfigError("port must be between 0 and 65535, http_port and http_api_port between -1 and 65535")
        if self.bayeux_timeout <= 0 or self.bayeux_max_interval <= 0 or self.bayeux_interval < 0:
            raise ConfigError("bayeux_timeout and bayeux_max_interval must be positive, bayeux_interval >= 0")
        if self.bayeux_max_unacked <= 0 or self.http_api_max_body <= 0:
            raise ConfigError("bayeux_max_unacked and http_api_max_body must be positive")
        try:
            Origins.parse(self.http_api_allow_origins)
        except OriginError as exc:
            raise ConfigError(f"http_api_allow_origins: {exc}") from None
        if self.pull_ack_replay not in ("204", "405"):
            raise ConfigError(f"pull_ack_replay: expected '204' or '405', got {self.pull_ack_replay!r}")
        if self.pull_max_wait < 0 or self.pull_tombstone_ttl < 0 or self.pull_ack_replay_window < 0:
            raise ConfigError("pull_max_wait, pull_tombstone_ttl and pull_ack_replay_window must be >= 0")
        if not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", self.bayeux_path):
            raise ConfigError(f"bayeux_path: expected a URL path such as '/cometd', got {self.bayeux_path!r}")
        if not re.fullmatch(r"[a-zA-Z0-9_-]+", self.cluster_id):
            raise ConfigError(f"cluster_id: only letters, digits, '-' and '_' are allowed, got {self.cluster_id!r}")
        for name in _POSITIVE_DURATIONS:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if (self.tls or self.tls_verify) and not (self.tls_cert and self.tls_key):
            raise ConfigError("TLS needs tls_cert and tls_key")
        if self.tls_verify and not self.tls_ca_cert:
            raise ConfigError("tls_verify needs tls_ca_cert, the CA that signs client certificates")
        if bool(self.user) != bool(self.password):
            raise ConfigError("user and password go together")
        try:
            self.authenticator()
        except ValueError as exc:
            raise ConfigError(f"authentication: {exc}") from None
        if self.connect_timeout < 0:
            raise ConfigError(f"connect_timeout must be >= 0 (0: no limit), got {self.connect_timeout}")
        if self.nats_server:
            try:
                parse_urls(self.nats_server)
            except ValueError as exc:
                raise ConfigError(f"nats_server: {exc}") from None
        if self.partitioning and not self.nats_server:
            raise ConfigError("partitioning needs nats_server: the servers sharing the channels meet in that cluster")
        if self.hash_partition:
            if not self.nats_server:
                raise ConfigError("hash_partition needs nats_server (`--workers` sets both)")
            try:
                from streaming.stan.partitions import parse_hash_partition  # it loads Trio (start-up time)

                parse_hash_partition(self.hash_partition)
            except ValueError as exc:
                raise ConfigError(f"hash_partition: {exc}") from None
        if (self.partitioning or self.hash_partition) and self.http_api_port:
            raise ConfigError(
                "http_api_port with partitioning: the HTTP doors (Bayeux, pull) are not partitioned; serve them "
                "from a server that owns every channel"
            )
        if self.ft_group:
            if not self.nats_server:
                raise ConfigError("ft_group needs nats_server: the group's log and lease are in its JetStream")
            if self.store != "lmdb":
                raise ConfigError("ft_group needs the lmdb store (each member keeps a copy of the group's data)")
            if not 1 <= self.ft_replicas <= 5:
                raise ConfigError("ft_replicas must be 1 to 5 (JetStream's replica counts)")
            if self.ft_lease < 0.5:
                raise ConfigError("ft_lease must be at least 0.5s")
        if self.partitioning and not self.hash_partition and not self.channels:
            raise ConfigError('partitioning needs the channels this server owns: [channels."NAME"] tables')
        if bool(self.tls_client_cert) != bool(self.tls_client_key):
            raise ConfigError("tls_client_cert and tls_client_key go together")
        if self.nats_creds and self.nats_nkey_seed:
            raise ConfigError("nats_creds holds an nkey seed already: give nats_creds or nats_nkey_seed")
        if bool(self.nats_user) != bool(self.nats_password):
            raise ConfigError("nats_user and nats_password go together")
        if not self.server_name or any(c.isspace() for c in self.server_name):
            raise ConfigError(f"server_name: expected a name without spaces, got {self.server_name!r}")
        if self.hb_fail_count < 0 or self.max_payload <= 0 or self.max_pending <= 0:
            raise ConfigError("hb_fail_count must be >= 0; max_payload and max_pending must be positive")
        self.store_limits()

    def authenticator(self) -> Authenticator:
        """Who may connect to the NATS port (raises ValueError for a configuration it refuses)."""
        users = []
        for u in self.users:
            if u.nkey and (u.user or u.password):
                raise ValueError("a user has an nkey or a user and password, not both")
            permissions = None if u.permissions is None else Permissions(**attrs.asdict(u.permissions, recurse=False))
            users.append(User(u.nkey, "", permissions, nkey=True) if u.nkey else User(u.user, u.password, permissions))
        if self.user:
            users.append(User(self.user, self.password))
        return Authenticator(self.auth_token, users)

    def allowed_origins(self) -> Origins:
        """The pages that may use the HTTP client port (checked when the configuration is made)."""
        return Origins.parse(self.http_api_allow_origins)

    def tls_files(self) -> TlsFiles | None:
        """The certificate files of the listeners, or None: no TLS."""
        if not (self.tls or self.tls_verify):
            return None
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_ca_cert, self.tls_verify)

    def store_limits(self) -> StoreLimits:
        """The store's limits (raises ConfigError for values it refuses)."""
        try:
            return StoreLimits(
                max_channels=self.max_channels,
                max_subs=self.max_subs,
                channel=_channel_limits(self.limits),
                per_channel={name: _channel_limits(c) for name, c in self.channels.items()},
            )
        except ValueError as exc:
            raise ConfigError(f"limits: {exc}") from exc


def _channel_limits(c: LimitsConfig | ChannelConfig) -> ChannelLimits:
    return ChannelLimits(c.max_msgs, c.max_bytes, c.max_age, c.max_inactivity)


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(Duration, lambda v, _: Duration(parse_duration(v)))
    converter.register_structure_hook(Size, lambda v, _: Size(parse_size(v)))
    converter.register_structure_hook(bool, lambda v, _: parse_bool(v))  # not bool("false"), which is True
    converter.register_structure_hook(Rule, _rule)
    for cls in (LimitsConfig, ChannelConfig, PermissionsConfig, UserConfig, ServerConfig):
        converter.register_structure_hook(cls, make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True))
    return converter


def _rule(value: Any, _: type) -> Rule:
    """A permission rule: a list of allowed subjects, or a table with `allow` and `deny` lists."""
    if isinstance(value, list):
        value = {"allow": value}
    if not isinstance(value, dict) or set(value) - {"allow", "deny"}:
        raise ConfigError(f"permissions: expected a list of subjects or a table of allow and deny, got {value!r}")
    try:
        return Rule(tuple(map(str, value.get("allow", ()))), tuple(map(str, value.get("deny", ()))))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


_CONVERTER = _converter()


def structure(data: dict[str, Any]) -> ServerConfig:
    try:
        return _CONVERTER.structure(data, ServerConfig)
    except ConfigError:
        raise
    except Exception as exc:
        # transform_error names each bad key by its path, e.g. "... @ $.limits.max_age".
        raise ConfigError("; ".join(cattrs.transform_error(exc, path="config", format_exception=_format))) from None


def _format(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, ConfigError) or (type(exc) is ValueError and "expected" in str(exc)):
        return str(exc)
    return format_exception(exc, type_)


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> ServerConfig:
    """Read a TOML file, apply flag overrides (top-level keys), and build the config."""
    import tomllib  # only a start with a file pays for loading it

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    try:
        return merged(data, overrides or {})
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def merged(data: dict[str, Any], overrides: dict[str, Any]) -> ServerConfig:
    data = dict(data)
    limits = dict(data.get("limits", {}))
    for key, value in overrides.items():
        if key in ("max_msgs", "max_bytes", "max_age", "max_inactivity"):
            limits[key] = value
        else:
            data[key] = value
    if limits:
        data["limits"] = limits
    return structure(data)
