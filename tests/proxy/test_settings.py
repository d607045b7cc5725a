from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest

from mqproxy.settings import (
    Settings,
    SettingsError,
    build_settings,
    env_overrides,
    load_settings,
    parse_hostport,
)

DEFAULT_TOML = Path(str(files("mqproxy.config") / "mqproxy.toml"))


def test_default_toml_documents_every_key_with_its_default() -> None:
    assert load_settings(DEFAULT_TOML) == Settings()
    text = DEFAULT_TOML.read_text()
    for section, values in Settings().as_dict().items():
        assert f"[{section}]" in text
        for key in values:
            assert f"\n{key} = " in text, f"{section}.{key} undocumented in mqproxy.toml"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[server]\nlisten = "127.0.0.1:1"\nsnif_timeout_s = 3\n')
    with pytest.raises(SettingsError, match=r"server\.snif_timeout_s"):
        load_settings(cfg)


def test_unknown_section_is_named() -> None:
    with pytest.raises(SettingsError, match="serverz"):
        build_settings({"serverz": {}})


@pytest.mark.parametrize(
    ("section", "key", "value", "match"),
    [
        ("server", "sniff_timeout_s", 0.0, r"server\.sniff_timeout_s.*out of range"),
        ("store", "flush", "sometimes", r"store\.flush.*not one of"),
        ("store", "default_queue_count", "4", r"store\.default_queue_count: expected int"),
        ("store", "auto_create_topics", 1, r"store\.auto_create_topics: expected bool"),
        ("server", "listen", "nohostport", r"server\.listen"),
        ("server", "listen", "127.0.0.1:70000", r"server\.listen.*out of range"),
        ("store", "delete_when", "4am", r"store\.delete_when"),
        ("store", "delete_when", "25", r"store\.delete_when"),
        ("store", "disk_max_used_ratio", 0.99, r"store\.disk_max_used_ratio.*out of range"),
        ("store", "file_reserved_hours", -1.0, r"store\.file_reserved_hours.*out of range"),
        ("trace", "enabled", "yes", r"trace\.enabled: expected bool"),
        ("trace", "topic", "bad topic", r"trace\.topic: 'bad topic' is not a topic name"),
        ("trace", "topic", "", r"trace\.topic"),
        ("trace", "topic", "x" * 128, r"trace\.topic"),
        ("trace", "buffer_records", 0, r"trace\.buffer_records.*out of range"),
        ("trace", "log_sample_rate", 1.5, r"trace\.log_sample_rate.*out of range"),
    ],
)
def test_bad_values_are_named(section: str, key: str, value: object, match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        build_settings({section: {key: value}})


def test_env_overrides_coerce_and_win_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[store]\nflush = "async"\nflush_interval_ms = 100\n')
    env = {
        "MQPROXY_STORE_FLUSH": "sync",
        "MQPROXY_STORE_FLUSH_INTERVAL_MS": "50",
        "MQPROXY_STORE_AUTO_CREATE_TOPICS": "false",
        "MQPROXY_SERVER_SNIFF_TIMEOUT_S": "1.5",
        "UNRELATED": "x",
    }
    s = load_settings(cfg, env)
    assert (s.store.flush, s.store.flush_interval_ms, s.store.auto_create_topics) == ("sync", 50, False)
    assert s.server.sniff_timeout_s == 1.5


def test_env_bad_value_names_key() -> None:
    with pytest.raises(SettingsError, match=r"store\.flush_interval_ms: expected int"):
        load_settings(None, {"MQPROXY_STORE_FLUSH_INTERVAL_MS": "fast"})
    with pytest.raises(SettingsError, match="MQPROXY_STORE"):
        env_overrides({"MQPROXY_STORE": "x"})


def test_overrides_win_over_env() -> None:
    s = load_settings(None, {"MQPROXY_SERVER_LISTEN": "127.0.0.1:1"}, {"server": {"listen": "127.0.0.1:0"}})
    assert s.server.listen == "127.0.0.1:0"


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.server.listen = "x"  # type: ignore[misc]


def test_tls_keys_go_together() -> None:
    with pytest.raises(SettingsError, match="together"):
        build_settings({"tls": {"cert_file": "a.pem"}})


def test_bad_toml_is_a_settings_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[server\n")
    with pytest.raises(SettingsError, match=r"c\.toml"):
        load_settings(cfg)
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")


def test_parse_hostport_ipv6() -> None:
    assert parse_hostport("[::1]:9876") == ("::1", 9876)


def test_backend_defaults_to_the_embedded_store() -> None:
    s = Settings()
    assert (s.backend.kind, s.backend.cluster, s.backend.namesrv_addresses) == ("embedded", False, ())


def test_backend_rocketmq_from_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[backend]\nkind = "rocketmq"\nnamesrv = "10.0.0.1:9876; [::1]:9877;"\n'
        'access_key = "ak"\nsecret_key = "sk"\nrefresh_s = 5\nrequest_timeout_s = 1.5\n'
    )
    backend = load_settings(cfg).backend
    assert backend.cluster
    assert backend.namesrv_addresses == ("10.0.0.1:9876", "[::1]:9877")
    assert (backend.access_key, backend.secret_key) == ("ak", "sk")
    assert (backend.refresh_s, backend.request_timeout_s) == (5.0, 1.5)


def test_backend_from_the_environment() -> None:
    env = {
        "MQPROXY_BACKEND_KIND": "rocketmq",
        "MQPROXY_BACKEND_NAMESRV": "127.0.0.1:9876;127.0.0.1:9877",
        "MQPROXY_BACKEND_ACCESS_KEY": "ak",
        "MQPROXY_BACKEND_SECRET_KEY": "sk",
        "MQPROXY_BACKEND_REFRESH_S": "2.5",
        "MQPROXY_BACKEND_REQUEST_TIMEOUT_S": "1",
    }
    backend = load_settings(None, env).backend
    assert backend.kind == "rocketmq"
    assert backend.namesrv_addresses == ("127.0.0.1:9876", "127.0.0.1:9877")
    assert (backend.access_key, backend.secret_key, backend.refresh_s, backend.request_timeout_s) == (
        "ak",
        "sk",
        2.5,
        1.0,
    )


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"kind": "cluster"}, r"backend\.kind.*not one of embedded, rocketmq"),
        ({"kind": "rocketmq"}, r"backend\.namesrv: required"),
        ({"kind": "rocketmq", "namesrv": " ; "}, r"backend\.namesrv: required"),
        ({"kind": "rocketmq", "namesrv": "127.0.0.1"}, r"backend\.namesrv: expected HOST:PORT"),
        ({"kind": "rocketmq", "namesrv": "127.0.0.1:9876;ns2"}, r"backend\.namesrv: expected HOST:PORT"),
        ({"kind": "rocketmq", "namesrv": "127.0.0.1:port"}, r"backend\.namesrv: port must be an integer"),
        ({"kind": "rocketmq", "namesrv": "127.0.0.1:70000"}, r"backend\.namesrv: port 70000 out of range"),
        ({"kind": "rocketmq", "namesrv": "127.0.0.1:0"}, r"backend\.namesrv: port 0"),
        ({"access_key": "ak"}, r"backend\.access_key and backend\.secret_key"),
        ({"secret_key": "sk"}, r"backend\.access_key and backend\.secret_key"),
        ({"refresh_s": 0.0}, r"backend\.refresh_s.*out of range"),
        ({"request_timeout_s": 0.0}, r"backend\.request_timeout_s.*out of range"),
        ({"namesrv": 9876}, r"backend\.namesrv: expected str"),
    ],
)
def test_bad_backend_values_are_named(values: dict[str, object], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        build_settings({"backend": values})


def test_namesrv_is_checked_only_for_the_rocketmq_backend() -> None:
    assert build_settings({"backend": {"namesrv": "not an address"}}).backend.kind == "embedded"
    with pytest.raises(SettingsError, match=r"backend\.namesrv"):
        load_settings(None, {"MQPROXY_BACKEND_KIND": "rocketmq", "MQPROXY_BACKEND_NAMESRV": "nohost"})


def test_the_secret_key_is_redacted_in_the_logged_config() -> None:
    s = build_settings({"backend": {"access_key": "ak", "secret_key": "sk"}})
    assert s.as_dict()["backend"]["access_key"] == "ak"
    assert s.as_dict()["backend"]["secret_key"] == "<redacted>"
    assert Settings().as_dict()["backend"]["secret_key"] == ""


def test_retention_settings_make_the_policy() -> None:
    store = build_settings({"store": {"file_reserved_hours": 0.5, "delete_when": "04;16"}}).store
    policy = store.retention_policy()
    assert policy.file_reserved_ms == 1_800_000
    assert policy.delete_hours == frozenset({4, 16})
    assert (policy.max_used_ratio, policy.clean_forcibly_ratio, policy.warning_ratio) == (0.75, 0.85, 0.90)
    assert build_settings({"store": {"delete_when": "*"}}).store.retention_policy().delete_hours is None


def test_trace_defaults_and_environment() -> None:
    assert (Settings().trace.enabled, Settings().trace.topic) == (False, "RMQ_SYS_TRACE_TOPIC")
    env = {"MQPROXY_TRACE_ENABLED": "true", "MQPROXY_TRACE_TOPIC": "MY_TRACE"}
    settings = load_settings(environ=env)
    assert (settings.trace.enabled, settings.trace.topic) == (True, "MY_TRACE")
