"""
mqproxy.connector.cli
~~~~~~~~~~~~~~~~~~~~~

``mqproxy connect --config rules.toml [--metrics HOST:PORT]``: exit status 0 after SIGTERM/SIGINT, 2 for
a bad rules file or argument (``file:line: field: problem`` on stderr), 1 when it cannot start.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

from mqproxy.connector.rules import ConnectorConfig, RulesError, parse_rules
from mqproxy.connector.runner import run_connector

__all__ = ["add_parser", "connect", "prepare"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    connect_ = sub.add_parser("connect", help="copy topics between clusters by rules (Message Connector)")
    connect_.add_argument("--config", type=Path, required=True, help="rules file (TOML)")
    connect_.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus /metrics there (port 0: any)"
    )
    connect_.add_argument("--log-format", choices=("json", "console"), default="json", help="log rendering")


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--metrics: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def prepare(args: argparse.Namespace) -> tuple[ConnectorConfig, tuple[str, int] | None] | int:
    """The rules and metrics address of parsed ``args``, or the exit status (2) after a message on stderr."""
    path: Path = args.config
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"mqproxy connect: {path}: cannot read: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        return parse_rules(text, str(path)), (_address(args.metrics) if args.metrics else None)
    except (RulesError, ValueError) as exc:
        print(f"mqproxy connect: {exc}", file=sys.stderr)
        return 2


def connect(config: ConnectorConfig, metrics_at: tuple[str, int] | None) -> int:
    """Run the connector (logging already configured); returns the exit status."""
    try:
        trio.run(run_connector, config, metrics_at)
    except OSError as exc:
        print(f"mqproxy connect: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0
