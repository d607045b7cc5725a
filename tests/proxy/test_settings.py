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
    with pytest.raises(SettingsError, match="c.toml"):
        load_settings(cfg)
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")


def test_parse_hostport_ipv6() -> None:
    assert parse_hostport("[::1]:9876") == ("::1", 9876)
