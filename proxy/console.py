"""
mqproxy.console
~~~~~~~~~~~~~~~

The read-only live console on the one port, the thin I/O side: reads a
:class:`~mqproxy.console_view.ConsoleSnapshot` off the :class:`~mqproxy.context.ServerState`, applies the
access decision of :mod:`mqproxy.console_auth` and answers the paths below (HTTP framing is
:mod:`mqproxy.http`'s).

Paths (GET; HEAD too except the event stream):

* ``/console``: the page, server-rendered (readable without script);
* ``/console/console.js``, ``/console/console.css``: its script and style;
* ``/console/snapshot.json``: one snapshot, as an event carries it;
* ``/console/events``: server-sent events, one ``snapshot`` event every :data:`PUSH_INTERVAL_S` until the
  client goes, the server drains, or the access rules reloaded no longer admit the credentials. At most
  :data:`MAX_STREAMS` at once (503 beyond).

Every answer carries a Content-Security-Policy that allows only the console's own script, style and event
stream, ``X-Content-Type-Options: nosniff`` and ``Cache-Control: no-store``. Sources: connections from the
server's live table, topics from the facade (listed at most every :data:`TOPIC_REFRESH_S`), consumer lag from
the reading ``/metrics`` exports (:mod:`mqproxy.lag_sources`, same refresh), refusals from the server's
:class:`~mqproxy.rejections.RejectionRing`. The Message Connector runs as its own process
(``mqproxy connect``): its rules and delay are on its own ``/metrics``, not here.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from mqproxy.acl.holder import DENIAL_REASONS
from mqproxy.console_assets import SCRIPT, STYLE
from mqproxy.console_auth import Verdict, decide
from mqproxy.console_view import (
    MAX_CONNECTION_ROWS,
    MAX_LAG_ROWS,
    MAX_TOPIC_NAMES,
    ConnRow,
    ConsoleSnapshot,
    LagRow,
    LagSection,
    TopicSection,
    render_page,
    snapshot_json,
)
from mqproxy.context import format_addr
from mqproxy.model.errors import BackendError
from mqproxy.model.properties import SCHEDULE_TOPIC
from mqproxy.model.topics import AUTO_CREATE_TEMPLATE_TOPIC, SYSTEM_TOPIC_PREFIX

if TYPE_CHECKING:
    from mqproxy.context import ServerState
    from mqproxy.runtime.context import ConnectionContext

__all__ = ["EVENTS_PATH", "MAX_STREAMS", "PREFIX", "Answer", "answer", "is_console_path", "stream_events"]

PREFIX = "/console"
EVENTS_PATH = "/console/events"
SCRIPT_PATH = "/console/console.js"
STYLE_PATH = "/console/console.css"
SNAPSHOT_PATH = "/console/snapshot.json"
#: Seconds between two snapshots on the event stream.
PUSH_INTERVAL_S = 1.0
#: Seconds one event may take to leave; a reader that stops reading loses its stream (and its slot).
SEND_TIMEOUT_S = 10.0
#: Event streams open at once, all clients together.
MAX_STREAMS = 16
#: Seconds a topic listing is reused.
TOPIC_REFRESH_S = 2.0
#: Seconds a snapshot waits for the backend (topics, lag) before it shows the last known figures.
BACKEND_WAIT_S = 2.0
CONNECTOR_NOTE = (
    "The Message Connector runs as its own process (mqproxy connect): its rules, delay and lag are on that "
    "process's /metrics (mqproxy_connector_*) and in its connector.* events."
)
_LMQ_PREFIX = "%LMQ%"
#: Listed after the clients' topics: RocketMQ's system topics (``rmq_sys_*``, ``RMQ_SYS_*``, the schedule,
#: template and check-limit topics) and mqproxy's MQTT session log (``mqtt.mapping.SESSION_STATE_TOPIC``;
#: the server core does not import protocol packages).
SYSTEM_PREFIXES = (SYSTEM_TOPIC_PREFIX, "RMQ_SYS_")
SYSTEM_NAMES = frozenset(
    {SCHEDULE_TOPIC, AUTO_CREATE_TEMPLATE_TOPIC, "TRANS_CHECK_MAX_TIME_TOPIC", "MQTT_SESSION_STATE"}
)
_SECURITY_HEADERS = (
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("cache-control", "no-store"),
    ("referrer-policy", "no-referrer"),
)
_TEXT = "text/plain; charset=utf-8"
_STATIC = {
    SCRIPT_PATH: ("text/javascript; charset=utf-8", SCRIPT.encode()),
    STYLE_PATH: ("text/css; charset=utf-8", STYLE.encode()),
}


def is_console_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def op_path(path: str) -> str:
    """The ``request`` event's path: the event stream or the console (a bounded set of ``op`` values)."""
    return EVENTS_PATH if path == EVENTS_PATH else PREFIX


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole response, or (``stream``) the go-ahead for :func:`stream_events` with these headers."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = _SECURITY_HEADERS
    stream: bool = False


def _is_system(topic: str) -> bool:
    return topic.startswith(SYSTEM_PREFIXES) or topic in SYSTEM_NAMES


async def _topics(server: ServerState) -> TopicSection:
    broker = server.broker
    if broker is None:
        return TopicSection(error="backend not open yet")
    cached = server.console_topics
    now = trio.current_time()
    if cached is not None and now - cached[0] < TOPIC_REFRESH_S:
        return cached[1]
    names: list[str] | None = None
    error = "backend did not answer in time"
    with trio.move_on_after(BACKEND_WAIT_S):
        try:
            names = await broker.topic_names()
        except BackendError as exc:
            error = f"backend: {exc}"
    if names is None:
        return cached[1] if cached is not None else TopicSection(error=error)
    plain = sorted((n for n in names if not n.startswith(_LMQ_PREFIX)), key=lambda n: (_is_system(n), n))
    section = TopicSection(
        topics=len(plain),
        lmqs=len(names) - len(plain),
        system=sum(1 for n in plain if _is_system(n)),
        names=tuple(plain[:MAX_TOPIC_NAMES]),
    )
    server.console_topics = (now, section)
    return section


async def _lag(server: ServerState) -> LagSection:
    broker = server.broker
    if broker is not None:
        with trio.move_on_after(BACKEND_WAIT_S):
            await server.metrics.lag_refresher(server.settings.metrics).refresh(broker)
    view = server.metrics.lag.view
    rows = sorted(
        (LagRow(group, topic, s.queues, s.lag) for (group, topic), s in view.pairs.items()),
        key=lambda r: (-r.lag, r.group, r.topic),
    )
    return LagSection(
        updated_unix_s=view.updated_unix_s,
        groups=tuple(sorted(view.group_totals().items())),
        rows=tuple(rows[:MAX_LAG_ROWS]),
        rows_total=len(rows),
        capped_pairs=view.capped_pairs,
    )


async def take_snapshot(server: ServerState) -> ConsoleSnapshot:
    """What the console shows now (waits at most about twice :data:`BACKEND_WAIT_S` for the backend)."""
    now = time.monotonic()
    live = sorted(server.live.values(), key=lambda c: c.started_monotonic)
    by_protocol = Counter(c.ctx.protocol or "negotiating" for c in live)
    rows = tuple(
        ConnRow(
            conn_id=c.ctx.conn_id,
            protocol=c.ctx.protocol or "negotiating",
            client_id=c.ctx.client_id,
            peer=format_addr(c.ctx.peer),
            age_s=round(now - c.started_monotonic, 1),
            bytes_in=c.wire.bytes_in,
            bytes_out=c.wire.bytes_out,
        )
        for c in live[:MAX_CONNECTION_ROWS]
    )
    return ConsoleSnapshot(
        taken_unix_s=time.time(),
        uptime_s=round(now - server.started_monotonic, 1),
        backend=server.backend_name,
        open_connections=len(live),
        connections_total=server.connections_total,
        by_protocol=tuple(sorted(by_protocol.items())),
        connections=rows,
        topics=await _topics(server),
        lag=await _lag(server),
        connector_note=CONNECTOR_NOTE,
        rejections=server.rejections.rows(),
    )


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _verdict(server: ServerState, ctx: ConnectionContext, authorization: str | None) -> Verdict:
    holder, settings = server.acl, server.settings.console
    ip = ctx.peer[0]
    rules = holder.rules
    wait = 0.0 if rules is None else holder.throttle.delay_for(ip, holder.clock())
    return decide(
        rules,
        authorization,
        ip,
        enabled=settings.enabled,
        allow_remote=settings.allow_remote,
        throttle_wait_s=wait,
    )


def _apply(server: ServerState, ctx: ConnectionContext, verdict: Verdict) -> None:
    """Feed the throttle and report the refusal (``auth.denied``, the counter, recent rejections). The
    throttle's clock is the holder's, as every protocol's checks read it."""
    throttle, ip = server.acl.throttle, ctx.peer[0]
    if verdict.throttle == "failed":
        throttle.failed(ip, server.acl.clock())
    elif verdict.throttle == "succeeded":
        throttle.succeeded(ip)
    if verdict.status != 200 and verdict.reason in DENIAL_REASONS:
        server.acl.denied(
            ctx.log,
            protocol="http",
            peer=format_addr(ctx.peer),
            access_key=verdict.access_key,
            reason=verdict.reason or "",
            detail=verdict.detail,
            emit=verdict.emit,
        )


async def answer(
    server: ServerState, ctx: ConnectionContext, method: bytes, path: str, headers: list[tuple[bytes, bytes]]
) -> Answer:
    """The answer to one console request (access first: a refusal carries no data)."""
    verdict = _verdict(server, ctx, _header(headers, b"authorization"))
    _apply(server, ctx, verdict)
    if verdict.status != 200:
        body = (verdict.detail or "refused").encode() + b"\n"
        return Answer(verdict.status, _TEXT, body, _SECURITY_HEADERS + verdict.headers)
    if method not in (b"GET", b"HEAD") or (method == b"HEAD" and path == EVENTS_PATH):
        return Answer(405, _TEXT, b"method not allowed\n", (*_SECURITY_HEADERS, ("allow", "GET")))
    if path in (PREFIX, PREFIX + "/"):
        page = render_page(
            await take_snapshot(server),
            events_path=EVENTS_PATH,
            script_path=SCRIPT_PATH,
            style_path=STYLE_PATH,
        )
        return Answer(200, "text/html; charset=utf-8", page.encode())
    if path in _STATIC:
        content_type, body = _STATIC[path]
        return Answer(200, content_type, body)
    if path == SNAPSHOT_PATH:
        return Answer(200, "application/json", snapshot_json(await take_snapshot(server)))
    if path == EVENTS_PATH:
        if server.console_streams >= MAX_STREAMS:
            return Answer(
                503, _TEXT, b"too many console event streams\n", (*_SECURITY_HEADERS, ("retry-after", "5"))
            )
        return Answer(
            200, "text/event-stream", b"", (*_SECURITY_HEADERS, ("x-accel-buffering", "no")), stream=True
        )
    return Answer(404, _TEXT, b"not found\n")


async def stream_events(
    server: ServerState,
    ctx: ConnectionContext,
    authorization: str | None,
    send: Callable[[bytes], Awaitable[None]],
) -> None:
    """Push snapshots through ``send`` until the peer goes (a failed send, or one not done within
    :data:`SEND_TIMEOUT_S`), the server drains, or a reload of the access rules no longer admits
    ``authorization``."""
    server.console_streams += 1
    generation = server.acl.generation
    try:
        await send(b"retry: 2000\n\n")
        while not server.draining.is_set():
            if server.acl.generation != generation:
                generation = server.acl.generation
                if _verdict(server, ctx, authorization).status != 200:
                    return
            payload = snapshot_json(await take_snapshot(server))
            with trio.fail_after(SEND_TIMEOUT_S):
                await send(b"event: snapshot\ndata: " + payload + b"\n\n")
            with trio.move_on_after(PUSH_INTERVAL_S):
                await server.draining.wait()
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
        return
    finally:
        server.console_streams -= 1
