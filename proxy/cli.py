"""``mqproxy serve`` and ``mqproxy connect`` (the Message Connector, :mod:`mqproxy.connector`): the
command-line entry point."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import trio

from mqproxy import __version__
from mqproxy.connector import cli as connector_cli
from mqproxy.log import configure_logging
from mqproxy.settings import LogSettings, SettingsError, load_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqproxy", description="Multi-protocol messaging proxy.")
    parser.add_argument("--version", action="version", version=f"mqproxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy on one TCP port")
    serve.add_argument("--config", type=Path, help="TOML settings file (see config/mqproxy.toml)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="listen address; port 0 picks a free port")
    serve.add_argument("--data-dir", metavar="DIR", help="embedded store directory")
    serve.add_argument("--log-format", choices=("json", "console"), help="log rendering")
    connector_cli.add_parser(sub)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if args.listen:
        out.setdefault("server", {})["listen"] = args.listen
    if args.data_dir:
        out.setdefault("store", {})["data_dir"] = args.data_dir
    if args.log_format:
        out.setdefault("log", {})["format"] = args.log_format
    return out


def _connect(args: argparse.Namespace) -> int:
    prepared = connector_cli.prepare(args)
    if isinstance(prepared, int):
        return prepared
    configure_logging(LogSettings(format=args.log_format))
    return connector_cli.connect(*prepared)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "connect":
        return _connect(args)
    try:
        settings = load_settings(args.config, os.environ, _overrides(args))
    except SettingsError as exc:
        print(f"mqproxy: configuration error: {exc}", file=sys.stderr)
        return 2
    sink = configure_logging(settings.log)
    from mqproxy.server import serve  # after logging is configured

    try:
        trio.run(functools.partial(serve, freeze_heap=True), settings)
    except SettingsError as exc:
        print(f"mqproxy: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        structlog.get_logger("mqproxy.server").error("proxy.failed", detail=str(exc))
        print(f"mqproxy: cannot start: {exc}", file=sys.stderr)
        return 1
    finally:
        if hasattr(sink, "close") and sink not in (sys.stdout.buffer, sys.stderr):
            sink.close()
    return 0
