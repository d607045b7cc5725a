"""Typed, frozen settings loaded from TOML with ``MQPROXY_<SECTION>_<KEY>`` environment overrides.

Precedence (lowest first): defaults in this module, the TOML file, environment variables, explicit
overrides (CLI flags). An unknown section or key, a value of the wrong type or one out of range is a
:class:`SettingsError` naming the key. Every key is documented in ``config/mqproxy.toml``.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from mqproxy.backends.embedded.retention import RetentionPolicy, parse_delete_when
from mqproxy.facade.routing_rules import RoutingTable
from mqproxy.setting_values import SettingsError, parse_hostport, parse_namesrv

ENV_PREFIX = "MQPROXY_"


def _range(lo: float, hi: float) -> dict[str, Any]:
    return {"range": (lo, hi)}


def _choice(*values: str) -> dict[str, Any]:
    return {"choices": values}


@dataclass(frozen=True, slots=True)
class ServerSettings:
    listen: str = "127.0.0.1:9876"
    advertised_address: str = ""
    sniff_timeout_s: float = field(default=5.0, metadata=_range(0.05, 300))
    max_sniff_bytes: int = field(default=4096, metadata=_range(2112, 1 << 20))
    tls_handshake_timeout_s: float = field(default=10.0, metadata=_range(0.05, 300))
    shutdown_grace_s: float = field(default=10.0, metadata=_range(0, 3600))
    drain_window_s: float = field(default=0.0, metadata=_range(0, 3600))
    idle_timeout_s: float = field(default=120.0, metadata=_range(1, 86400))
    frame_timeout_s: float = field(default=10.0, metadata=_range(0.05, 3600))
    max_connections: int = field(default=0, metadata=_range(0, 10_000_000))
    max_connections_per_address: int = field(default=0, metadata=_range(0, 10_000_000))
    grpc_max_concurrent_streams: int = field(default=1000, metadata=_range(1, 1_000_000))


@dataclass(frozen=True, slots=True)
class TlsSettings:
    cert_file: str = ""
    key_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file and self.key_file)


@dataclass(frozen=True, slots=True)
class LogSettings:
    format: str = field(default="json", metadata=_choice("json", "console"))
    level: str = field(default="info", metadata=_choice("debug", "info", "warning", "error"))
    file: str = ""
    request_sample_rate: float = field(default=1.0, metadata=_range(0.0, 1.0))
    rotate_bytes: int = field(default=64 * 1024 * 1024, metadata=_range(0, 1 << 40))
    rotate_interval_s: float = field(default=3600.0, metadata=_range(0, 30 * 86400))
    flush_interval_ms: int = field(default=100, metadata=_range(0, 60_000))
    buffer_bytes: int = field(default=64 * 1024, metadata=_range(1, 64 * 1024 * 1024))


@dataclass(frozen=True, slots=True)
class StoreSettings:
    backend: str = field(default="embedded", metadata=_choice("embedded", "memory"))
    data_dir: str = "./data"
    flush: str = field(default="async", metadata=_choice("async", "sync"))
    flush_interval_ms: int = field(default=200, metadata=_range(1, 60_000))
    segment_bytes: int = field(default=256 * 1024 * 1024, metadata=_range(64 * 1024, 1 << 34))
    default_queue_count: int = field(default=4, metadata=_range(1, 1024))
    auto_create_topics: bool = True
    max_message_bytes: int = field(default=4 * 1024 * 1024, metadata=_range(1024, 64 * 1024 * 1024))
    lmq_idle_seconds: int = field(default=3600, metadata=_range(0, 365 * 86400))
    lmq_sweep_interval_seconds: float = field(default=60.0, metadata=_range(0.1, 86400))
    # Retention (RocketMQ fileReservedTime, deleteWhen, diskMaxUsedSpaceRatio, diskSpaceCleanForciblyRatio,
    # diskSpaceWarningLevelRatio, cleanResourceInterval).
    file_reserved_hours: float = field(default=72.0, metadata=_range(0, 876_000))
    delete_when: str = "04"
    disk_max_used_ratio: float = field(default=0.75, metadata=_range(0.10, 0.95))
    disk_clean_forcibly_ratio: float = field(default=0.85, metadata=_range(0.10, 1.0))
    disk_warning_ratio: float = field(default=0.90, metadata=_range(0.10, 1.0))
    clean_interval_seconds: float = field(default=10.0, metadata=_range(0.01, 86400))

    def __post_init__(self) -> None:
        try:
            parse_delete_when(self.delete_when)
        except ValueError as exc:
            raise SettingsError(
                f"store.delete_when: {self.delete_when!r} is not hours of the day like '04', '04;16' "
                f"or '*' ({exc})"
            ) from None

    def retention_policy(self) -> RetentionPolicy:
        """The retention these settings ask for."""
        return RetentionPolicy(
            file_reserved_ms=round(self.file_reserved_hours * 3_600_000),
            delete_hours=parse_delete_when(self.delete_when),
            max_used_ratio=self.disk_max_used_ratio,
            clean_forcibly_ratio=self.disk_clean_forcibly_ratio,
            warning_ratio=self.disk_warning_ratio,
        )


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """The ``[backend]`` section: where messages live.

    ``kind = "embedded"`` (default): mqproxy's own store, configured by ``[store]``. ``kind = "rocketmq"``:
    a stock Apache RocketMQ cluster found through the name servers in ``namesrv`` (``host:port;host:port``,
    required then); mqproxy keeps no messages of its own. ``access_key`` / ``secret_key`` (both or neither)
    sign every request for brokers that enforce ACL.
    """

    kind: str = field(default="embedded", metadata=_choice("embedded", "rocketmq"))
    namesrv: str = ""
    access_key: str = ""
    secret_key: str = ""
    refresh_s: float = field(default=30.0, metadata=_range(0.1, 3600))
    request_timeout_s: float = field(default=3.0, metadata=_range(0.05, 600))

    def __post_init__(self) -> None:
        if self.kind == "rocketmq":
            parse_namesrv(self.namesrv)
        if bool(self.access_key) != bool(self.secret_key):
            raise SettingsError("backend.access_key and backend.secret_key must be set together")

    @property
    def cluster(self) -> bool:
        """True when messages live in a RocketMQ cluster (``kind = "rocketmq"``), not in this process."""
        return self.kind == "rocketmq"

    @property
    def namesrv_addresses(self) -> tuple[str, ...]:
        """The ``host:port`` entries of ``namesrv`` (empty when none is set)."""
        return parse_namesrv(self.namesrv) if self.namesrv.strip() else ()


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """The ``[routing]`` section with several backends: ``rules`` (``[[routing.rules]]`` tables of ``match``
    = ``exact:TOPIC`` | ``prefix:TEXT`` | ``re:REGEX`` and ``backend`` = a name), tried in order, and the
    ``default`` backend of topics no rule matches (``""``: none; such a topic is refused). ``[backend]``
    is the backend named ``default``. See :mod:`mqproxy.facade.routing_rules`."""

    default: str = ""
    rules: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    delay_levels: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    max_reconsume_times: int = field(default=16, metadata=_range(0, 1000))
    transaction_timeout_s: float = field(default=6.0, metadata=_range(0, 86400))
    transaction_check_interval_s: float = field(default=30.0, metadata=_range(0.01, 86400))
    transaction_check_max: int = field(default=15, metadata=_range(0, 1000))
    lock_ttl_s: float = field(default=60.0, metadata=_range(1, 86400))


@dataclass(frozen=True, slots=True)
class RemotingSettings:
    max_frame_bytes: int = field(default=16 * 1024 * 1024, metadata=_range(1024, 256 * 1024 * 1024))
    long_poll_max_s: float = field(default=30.0, metadata=_range(0, 3600))
    max_pull_batch: int = field(default=32, metadata=_range(1, 1024))
    max_inflight_requests: int = field(default=1024, metadata=_range(1, 1_000_000))


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """The ``[mqtt]`` section: gateway limits (mirroring :class:`mqproxy.mqtt.config.MqttConfig`) and auth.

    ``users`` maps a user name to a ``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>`` line;
    ``acl`` maps a user name (or ``*`` for every client) to ``{publish = [...], subscribe = [...]}``
    topic filter patterns in which ``%c`` is the client id and ``%u`` the user name.
    """

    allow_anonymous: bool = True
    users: dict[str, str] = field(default_factory=dict)
    acl: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    deny_subscribe: tuple[str, ...] = ()
    max_packet_size: int = field(default=1024 * 1024, metadata=_range(64, 268_435_455))
    receive_maximum: int = field(default=64, metadata=_range(1, 65535))
    default_send_quota: int = field(default=64, metadata=_range(1, 65535))
    max_send_quota: int = field(default=1024, metadata=_range(1, 65535))
    maximum_qos: int = field(default=2, metadata=_range(0, 2))
    topic_alias_maximum: int = field(default=16, metadata=_range(0, 65535))
    max_keep_alive: int = field(default=0, metadata=_range(0, 65535))
    connect_timeout_s: float = field(default=10.0, metadata=_range(0.1, 3600))
    write_timeout_s: float = field(default=30.0, metadata=_range(0.1, 3600))
    send_buffer_packets: int = field(default=1024, metadata=_range(1, 1_000_000))
    pull_batch: int = field(default=32, metadata=_range(1, 1024))
    read_cache_segments: int = field(default=4096, metadata=_range(0, 1_000_000))
    read_cache_bytes: int = field(default=64 * 1024 * 1024, metadata=_range(0, 1 << 34))
    poll_interval_s: float = field(default=30.0, metadata=_range(0.1, 3600))
    compaction_min_records: int = field(default=10_000, metadata=_range(1, 1 << 40))

    def __post_init__(self) -> None:
        from mqproxy.mqtt.auth import check_acl, parse_password_hash

        for user, line in self.users.items():
            try:
                parse_password_hash(line)
            except ValueError as exc:
                raise SettingsError(f"mqtt.users.{user}: {exc}") from None
        for user, rules in self.acl.items():
            try:
                check_acl(rules)
            except ValueError as exc:
                raise SettingsError(f"mqtt.acl.{user}: {exc}") from None


@dataclass(frozen=True, slots=True)
class AclSettings:
    """The ``[acl]`` section: the RocketMQ ACL 1.0 account file (``plain_acl.yml``) every protocol enforces.

    ``file`` empty = no access control. The server reads it at start (a malformed file stops it with exit
    status 2 naming ``path:line``) and re-reads it whenever its modification time, size or inode changes,
    checked every ``reload_interval_s``.
    """

    file: str = ""
    reload_interval_s: float = field(default=1.0, metadata=_range(0.05, 3600))


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Consumer-lag series on ``/metrics`` (:mod:`mqproxy.lag`)."""

    max_lag_series: int = field(default=2000, metadata=_range(0, 1_000_000))
    lag_refresh_s: float = field(default=15.0, metadata=_range(0.0, 3600))
    #: Seconds between ``metrics.lag`` log events of the consumer lag (0 = never).
    lag_log_interval_s: float = field(default=60.0, metadata=_range(0.0, 86400))


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """The read-only live console at ``/console`` (:mod:`mqproxy.console`). With an ``[acl] file`` only admin
    accounts see it (HTTP Basic, accessKey:secretKey); without one it is served to loopback sources only,
    unless ``allow_remote``."""

    enabled: bool = True
    allow_remote: bool = False


_TOPIC_NAME = re.compile(r"[%|A-Za-z0-9_-]{1,127}")


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """Message trace (:mod:`mqproxy.trace`): with ``enabled`` the proxy writes RocketMQ trace records
    (Pub, SubBefore, SubAfter) of every protocol's traffic to ``topic``, where ``mqadmin queryMsgTraceById``
    and RocketMQ Dashboard read them; at most ``buffer_records`` wait to be written (more are dropped).
    ``log_sample_rate``: the share of messages whose records are also logged (``trace.record``), chosen by
    message id so that a message is logged whole or not at all."""

    enabled: bool = False
    topic: str = "RMQ_SYS_TRACE_TOPIC"
    buffer_records: int = field(default=10_000, metadata=_range(1, 10_000_000))
    log_sample_rate: float = field(default=1.0, metadata=_range(0.0, 1.0))

    def __post_init__(self) -> None:
        if not _TOPIC_NAME.fullmatch(self.topic):
            raise SettingsError(
                f"trace.topic: {self.topic!r} is not a topic name (1-127 of letters, digits, %|_-)"
            )


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = ServerSettings()
    tls: TlsSettings = TlsSettings()
    log: LogSettings = LogSettings()
    backend: BackendSettings = BackendSettings()
    backends: dict[str, BackendSettings] = field(default_factory=dict)
    routing: RoutingSettings = RoutingSettings()
    store: StoreSettings = StoreSettings()
    broker: BrokerSettings = BrokerSettings()
    remoting: RemotingSettings = RemotingSettings()
    mqtt: MqttSettings = MqttSettings()
    acl: AclSettings = AclSettings()
    metrics: MetricsSettings = MetricsSettings()
    console: ConsoleSettings = ConsoleSettings()
    trace: TraceSettings = TraceSettings()

    @classmethod
    def for_tests(cls, data_dir: str | Path = "", **sections: Mapping[str, Any]) -> Settings:
        """Settings suited to in-process tests: port 0, memory backend unless a data dir is given."""
        base: dict[str, dict[str, Any]] = {
            "server": {"listen": "127.0.0.1:0", "sniff_timeout_s": 2.0, "shutdown_grace_s": 1.0},
            # no periodic lag events: an autojump clock would make them fire in tests that never asked
            "metrics": {"lag_log_interval_s": 0.0},
            "store": {"backend": "embedded", "data_dir": str(data_dir)}
            if data_dir
            else {"backend": "memory"},
        }
        for name, values in sections.items():
            base.setdefault(name, {}).update(values)
        return build_settings(base)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """All sections as plain dicts (for the ``proxy.config`` event); password hashes and the secret key
        are redacted."""
        out = {
            f.name: dataclasses.asdict(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name != "backends"
        }
        out["mqtt"]["users"] = {user: "<redacted>" for user in self.mqtt.users}
        if self.backend.secret_key:
            out["backend"]["secret_key"] = "<redacted>"
        out["backends"] = {name: dataclasses.asdict(b) for name, b in self.backends.items()}
        for name, named in self.backends.items():
            if named.secret_key:
                out["backends"][name]["secret_key"] = "<redacted>"
        return out

    @property
    def routed(self) -> bool:
        """True with several backends (any ``[backends.NAME]`` or ``[[routing.rules]]``)."""
        return bool(self.backends or self.routing.rules)

    def routing_table(self) -> RoutingTable:
        """The validated rules and default as a :class:`~mqproxy.facade.routing_rules.RoutingTable`."""
        from mqproxy.facade.routing_rules import parse_rule

        rules = tuple(parse_rule(rule["match"], rule["backend"]) for rule in self.routing.rules)
        return RoutingTable(rules, self.routing.default)

    def backends_in_use(self) -> dict[str, BackendSettings]:
        """The backends to open by name: every ``[backends.NAME]``, and ``[backend]`` as ``default`` when a
        rule or ``routing.default`` names it, or when there is no routing at all."""
        if not self.routed:
            return {"default": self.backend}
        table = self.routing_table()
        named = {rule.backend for rule in table.rules} | {table.default}
        return ({"default": self.backend} if "default" in named else {}) | dict(self.backends)

    @property
    def default_backend(self) -> BackendSettings | None:
        """The backend of topics no rule matches (and of MQTT), None when there is none."""
        if not self.routed:
            return self.backend
        name = self.routing.default
        return None if not name else self.backend if name == "default" else self.backends[name]


def _sections() -> dict[str, type]:
    hints = get_type_hints(Settings)
    return {f.name: hints[f.name] for f in dataclasses.fields(Settings)}


def _coerce_nested(key: str, kind: Any, value: Any) -> Any:
    """``tuple[str, ...]`` from a TOML array, ``dict[str, T]`` from a TOML table (recursively)."""
    origin, args = get_origin(kind), get_args(kind)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{key}: expected an array, got {type(value).__name__} {value!r}")
        return tuple(_coerce_nested(f"{key}[{i}]", args[0], item) for i, item in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise SettingsError(f"{key}: expected a table, got {type(value).__name__} {value!r}")
        return {str(k): _coerce_nested(f"{key}.{k}", args[1], v) for k, v in value.items()}
    return _coerce(key, kind, value, from_env=False)


def _coerce(key: str, kind: Any, value: Any, *, from_env: bool) -> Any:
    if get_origin(kind) is not None:
        if from_env:
            raise SettingsError(f"{key}: a table or array cannot be set from the environment")
        return _coerce_nested(key, kind, value)
    if from_env:
        text = str(value).strip()
        if kind is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise SettingsError(f"{key}: expected a boolean, got {text!r}")
        try:
            return kind(text)
        except ValueError:
            raise SettingsError(f"{key}: expected {kind.__name__}, got {text!r}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SettingsError(f"{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _build_section(name: str, cls: type, values: Mapping[str, Any], env_keys: set[str]) -> Any:
    hints = get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        full = f"{name}.{key}"
        if key not in known:
            raise SettingsError(f"unknown setting {full!r} (known: {', '.join(sorted(known))})")
        kind = hints[key]
        coerced = _coerce(full, kind, value, from_env=full in env_keys)
        meta = known[key].metadata
        if "range" in meta:
            lo, hi = meta["range"]
            if not lo <= coerced <= hi:
                raise SettingsError(f"{full}: {coerced!r} out of range {lo}..{hi}")
        if "choices" in meta and coerced not in meta["choices"]:
            raise SettingsError(f"{full}: {coerced!r} is not one of {', '.join(meta['choices'])}")
        kwargs[key] = coerced
    return cls(**kwargs)


def build_settings(values: Mapping[str, Mapping[str, Any]], env_keys: set[str] | None = None) -> Settings:
    """Validate nested ``{section: {key: value}}`` into :class:`Settings`."""
    sections = _sections()
    built: dict[str, Any] = {}
    from mqproxy.routing_settings import build_backends, check_routing  # imports this module

    for name, section_values in values.items():
        if name not in sections:
            raise SettingsError(f"unknown settings section {name!r} (known: {', '.join(sorted(sections))})")
        if not isinstance(section_values, Mapping):
            raise SettingsError(f"{name}: expected a table of keys")
        if name == "backends":
            built[name] = build_backends(section_values, env_keys or set())
            continue
        built[name] = _build_section(name, sections[name], section_values, env_keys or set())
    settings = Settings(**built)
    check_routing(settings)
    parse_hostport(settings.server.listen)
    if settings.server.advertised_address:
        from mqproxy.addresses import parse_advertised  # imports this module

        parse_advertised(settings.server.advertised_address)
    if bool(settings.tls.cert_file) != bool(settings.tls.key_file):
        raise SettingsError("tls.cert_file and tls.key_file must be set together")
    return settings


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``MQPROXY_STORE_DATA_DIR=x`` becomes ``{"store": {"data_dir": "x"}}``; section names hold no ``_``."""
    out: dict[str, dict[str, str]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        section, sep, key = name[len(ENV_PREFIX) :].lower().partition("_")
        if not sep or not key:
            raise SettingsError(f"environment variable {name}: expected {ENV_PREFIX}<SECTION>_<KEY>")
        out.setdefault(section, {})[key] = value
    return out


def load_settings(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Settings:
    """Defaults < TOML file < environment < ``overrides``."""
    merged: dict[str, dict[str, Any]] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path}: {exc}") from None
        for name, section in data.items():
            if not isinstance(section, dict):
                raise SettingsError(f"{name}: expected a [section] table at the top level")
            merged[name] = dict(section)
    env = env_overrides(environ or {})
    env_keys = {f"{s}.{k}" for s, keys in env.items() for k in keys}
    for source in (env, overrides or {}):
        for name, section in source.items():
            merged.setdefault(name, {}).update(section)
    return build_settings(merged, env_keys)
