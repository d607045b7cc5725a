"""
mqproxy.remoting.session
~~~~~~~~~~~~~~~~~~~~~~~~

The remoting protocol session: one per connection, no I/O of its own.

:class:`RemotingSession` owns what the protocol learns about a connection (client id, language and
version from heartbeats, the consumer groups it joined, the server->client opaque counter) and answers
requests through a dispatch table ``{RequestCode: handler}``. It talks to the broker only through the
:class:`~mqproxy.facade.api.BrokerFacade` and to other connections only through
:class:`~mqproxy.remoting.context.GroupMembership`.

Two entry points, one core:

* :meth:`RemotingSession.dispatch` -> :class:`Handled` (response or None, plus what the ``request``
  log event needs). The connection driver uses it so that it can time the write.
* :meth:`RemotingSession.handle` -> ``RemotingCommand | None``: dispatch and report the event at once
  (sizes measured by encoding the response); for tests and callers without a socket.

Nothing a client sends makes an exception escape: header problems, backend errors and handler bugs
all become error responses (SYSTEM_ERROR for bugs, logged as ``internal.error``). Oneway requests
(flag bit 1) are handled and never answered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog
import trio

from mqproxy.acl.holder import AUTHENTICATION_FAILURES, AclHolder
from mqproxy.codecs.remoting import RemotingCommand, encode_command
from mqproxy.codecs.remoting_codes import RequestCode, ResponseCode
from mqproxy.facade.api import BrokerFacade
from mqproxy.model.errors import (
    BackendError,
    BrokerRefused,
    IllegalTopic,
    InvalidArgument,
    InvalidDelay,
    MalformedReceipt,
    MessageAlreadyAcked,
    MessageTooLarge,
    OffsetOutOfRange,
    QueueNotFound,
    ReceiptExpired,
    StoreFull,
    StoreUnavailable,
    TopicNotFound,
    TransactionCheckWindowClosed,
)
from mqproxy.remoting import (
    admin,
    assignment,
    auth,
    clients,
    config_admin,
    consume,
    consumer_admin,
    locks,
    lookup,
    offsets,
    pop,
    produce,
    retry,
    routes,
    topic_admin,
    transactions,
)
from mqproxy.remoting.context import RequestCallback, RequestEvent, ServerContext, ignore_request
from mqproxy.remoting.errors import RequestError, WouldWait
from mqproxy.remoting.reply import Note, Reply
from mqproxy.runtime.holds import Holds

__all__ = ["HANDLERS", "Handled", "RemotingSession"]

_log = structlog.get_logger("mqproxy.remoting")


Handler = Callable[["RemotingSession", RemotingCommand, Note], Awaitable[Reply]]

#: Request code -> handler. Codes not listed are answered REQUEST_CODE_NOT_SUPPORTED.
HANDLERS: Final[dict[int, Handler]] = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: routes.get_route,
    RequestCode.SEND_MESSAGE: produce.send_message,
    RequestCode.SEND_MESSAGE_V2: produce.send_message_v2,
    RequestCode.SEND_BATCH_MESSAGE: produce.send_batch_message,
    RequestCode.PULL_MESSAGE: consume.pull_message,
    RequestCode.LITE_PULL_MESSAGE: consume.pull_message,
    RequestCode.QUERY_CONSUMER_OFFSET: offsets.query_consumer_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: offsets.update_consumer_offset,
    RequestCode.GET_MAX_OFFSET: offsets.get_max_offset,
    RequestCode.GET_MIN_OFFSET: offsets.get_min_offset,
    RequestCode.GET_EARLIEST_MSG_STORETIME: offsets.get_earliest_store_time,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: offsets.search_offset_by_timestamp,
    RequestCode.HEART_BEAT: clients.heart_beat,
    RequestCode.UNREGISTER_CLIENT: clients.unregister_client,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: clients.get_consumer_list,
    RequestCode.CHECK_CLIENT_CONFIG: clients.check_client_config,
    RequestCode.LOCK_BATCH_MQ: locks.lock_batch_mq,
    RequestCode.UNLOCK_BATCH_MQ: locks.unlock_batch_mq,
    RequestCode.CONSUMER_SEND_MSG_BACK: retry.consumer_send_msg_back,
    RequestCode.END_TRANSACTION: transactions.end_transaction,
    RequestCode.POP_MESSAGE: pop.pop_message,
    RequestCode.ACK_MESSAGE: pop.ack_message,
    RequestCode.BATCH_ACK_MESSAGE: pop.batch_ack_message,
    RequestCode.PEEK_MESSAGE: pop.peek_message,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: pop.change_invisible_time,
    RequestCode.NOTIFICATION: pop.notification,
    RequestCode.POLLING_INFO: pop.polling_info,
    RequestCode.GET_CONSUMER_RUNNING_INFO: admin.get_consumer_running_info,
    RequestCode.CONSUME_MESSAGE_DIRECTLY: admin.consume_message_directly,
    RequestCode.QUERY_MESSAGE: lookup.query_message,
    RequestCode.VIEW_MESSAGE_BY_ID: lookup.view_message_by_id,
    RequestCode.UPDATE_AND_CREATE_TOPIC: topic_admin.update_and_create_topic,
    RequestCode.GET_CONSUME_STATS: consumer_admin.get_consume_stats,
    RequestCode.SET_MESSAGE_REQUEST_MODE: assignment.set_message_request_mode,
    RequestCode.QUERY_ASSIGNMENT: assignment.query_assignment,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: consumer_admin.get_consumer_connection_list,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: consumer_admin.query_topic_consume_by_who,
    RequestCode.GET_BROKER_CLUSTER_INFO: topic_admin.get_broker_cluster_info,
    RequestCode.GET_TOPIC_CONFIG: topic_admin.get_topic_config,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: topic_admin.get_all_topic_list,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: config_admin.update_and_create_subscription_group,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: config_admin.delete_subscription_group,
}

#: BackendError subclass -> response code (spec §2, §3.2, §3.3, §3.17, §3.19; the broker services'
#: errors per :mod:`mqproxy.model.errors`). Others (MessageNotFound, TransactionNotFound,
#: TransactionAlreadyResolved, TransactionGroupMismatch, ...): SYSTEM_ERROR.
_BACKEND_CODES: Final[dict[type[BackendError], ResponseCode]] = {
    TopicNotFound: ResponseCode.TOPIC_NOT_EXIST,
    IllegalTopic: ResponseCode.INVALID_PARAMETER,
    QueueNotFound: ResponseCode.INVALID_PARAMETER,
    MessageTooLarge: ResponseCode.MESSAGE_ILLEGAL,
    StoreUnavailable: ResponseCode.SERVICE_NOT_AVAILABLE,
    InvalidArgument: ResponseCode.INVALID_PARAMETER,
    InvalidDelay: ResponseCode.MESSAGE_ILLEGAL,
    MalformedReceipt: ResponseCode.MESSAGE_ILLEGAL,
    ReceiptExpired: ResponseCode.NO_MESSAGE,
    MessageAlreadyAcked: ResponseCode.NO_MESSAGE,
    OffsetOutOfRange: ResponseCode.NO_MESSAGE,
    TransactionCheckWindowClosed: ResponseCode.ILLEGAL_OPERATION,
}

_OK_CODES: Final = frozenset(
    {
        ResponseCode.SUCCESS,
        # "nothing (yet)" answers of pull, pop and offset queries are normal flow, not errors
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.POLLING_TIMEOUT,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
        ResponseCode.QUERY_NOT_FOUND,
    }
)


def op_name(code: int) -> str:
    """``RequestCode`` name of ``code``, or ``UNKNOWN_<code>``."""
    try:
        return RequestCode(code).name
    except ValueError:
        return f"UNKNOWN_{code}"


def status_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


def backend_error_reply(exc: BackendError) -> Reply:
    """The error response for a backend exception (most specific class wins); a broker's own refusal
    (cluster backend) is passed through with its code and remark."""
    if isinstance(exc, BrokerRefused):
        return Reply(exc.code, remark=exc.remark)
    if isinstance(exc, StoreFull):  # the stock broker's own remark
        return Reply(ResponseCode.SERVICE_NOT_AVAILABLE, remark=str(exc))
    for cls in type(exc).__mro__:
        code = _BACKEND_CODES.get(cls)  # type: ignore[arg-type]
        if code is not None:
            break
    else:
        code = ResponseCode.SYSTEM_ERROR
    text = str(exc) or type(exc).__name__
    return Reply(code, remark=f"{type(exc).__name__}: {text}")


@dataclass(frozen=True, slots=True)
class Handled:
    """The outcome of one request: the response to send (None for oneway) and its log facts."""

    response: RemotingCommand | None
    op: str
    code: int
    status: str
    outcome: str
    client_id: str | None
    client_version: str | None
    group: str | None
    topic: str | None

    def event(self, *, latency_ms: float, req_bytes: int, resp_bytes: int) -> RequestEvent:
        return RequestEvent(
            op=self.op,
            code=self.code,
            status=self.status,
            outcome=self.outcome,
            latency_ms=latency_ms,
            req_bytes=req_bytes,
            resp_bytes=resp_bytes,
            client_id=self.client_id,
            client_version=self.client_version,
            group=self.group,
            topic=self.topic,
        )


class RemotingSession:
    """Protocol state of one remoting connection.

    ``conn`` is the opaque token :class:`~mqproxy.remoting.context.GroupMembership` knows this
    connection by; ``peer`` is the client address (born host of messages without one);
    ``on_request`` receives the ``request`` event of :meth:`handle`; ``log`` (a structlog logger,
    ideally bound to the connection) gets ``internal.error`` for handler bugs and ``auth.denied``.
    ``acl`` holds the access rules (see :mod:`mqproxy.remoting.auth`); None or ``acl.rules`` None: every
    request is served unchecked.
    """

    def __init__(
        self,
        broker: BrokerFacade,
        ctx: ServerContext,
        *,
        conn: object | None = None,
        peer: tuple[str, int] = ("127.0.0.1", 0),
        on_request: RequestCallback = ignore_request,
        log: Any = None,
        acl: AclHolder | None = None,
    ) -> None:
        self.broker = broker
        self.acl = acl
        self.log = _log if log is None else log
        self.ctx = ctx
        self.conn: object = self if conn is None else conn
        self.peer = peer
        self.on_request = on_request
        #: From the last HEART_BEAT (or any request before one): client id, language, version.
        self.client_id: str | None = None
        self.language: str | None = None
        self.version: int | None = None
        #: (consumer group, client id) pairs this connection registered with the broker.
        self.memberships: set[tuple[str, str]] = set()
        #: (consumer group, client id) pairs that took queue locks through this connection.
        self.lock_holders: set[tuple[str, str]] = set()
        #: Producer groups announced by heartbeats on this connection (transaction check-backs).
        self.producer_groups: set[str] = set()
        #: Retry topics already ensured by this session (avoids a create per heartbeat).
        self.ensured_topics: set[str] = set()
        #: Long polls (held PULL, POP, NOTIFICATION): ended at once when the server drains.
        self.holds = Holds()
        self._next_opaque = 0
        self._closed = False

    # --- identity --------------------------------------------------------------------------------
    @property
    def client_version(self) -> str | None:
        if self.language is None:
            return None
        return f"{self.language}/{self.version}"

    @property
    def legacy_records(self) -> bool:
        """Whether pull records must use IPv4 hosts only: every client but a modern Java one (>= 4.5.1;
        ali-ons also says JAVA, with version 121)."""
        return not (self.language == "JAVA" and (self.version or 0) >= 315)

    def next_opaque(self) -> int:
        """A fresh opaque for a server->client request (wraps within the positive int32 range)."""
        self._next_opaque = (self._next_opaque + 1) & 0x7FFFFFFF
        return self._next_opaque

    # --- requests --------------------------------------------------------------------------------
    async def dispatch(self, request: RemotingCommand, *, answer_at_once: bool = False) -> Handled:
        """Answer ``request``; never raises for anything the peer sent. With ``answer_at_once`` a handler
        that would wait (a pull that would be held) raises :class:`~mqproxy.remoting.errors.WouldWait`
        instead, before it answered."""
        if self.language is None:
            self.language, self.version = request.language, request.version
        note = Note(answer_at_once=answer_at_once)
        refusal = self._refusal(request)
        handler = HANDLERS.get(request.code)
        if refusal is not None:
            reply = refusal
        elif handler is None:
            reply = Reply(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f" request type {request.code} not supported",
            )
        else:
            reply = await self._run(handler, request, note)
        return self._handled(request, reply, note)

    def _refusal(self, request: RemotingCommand) -> Reply | None:
        """NO_PERMISSION when access control refuses ``request`` (reported through ``acl.denied``; failed
        authentication feeds the per-address throttle), None when it may be served."""
        acl = self.acl
        rules = None if acl is None else acl.rules
        if acl is None or rules is None:
            return None
        ip, now = self.peer[0], acl.clock()
        peer = f"[{ip}]:{self.peer[1]}" if ":" in ip else f"{ip}:{self.peer[1]}"
        access_key = request.ext_fields.get("AccessKey")
        wait = acl.throttle.delay_for(ip, now)
        if wait > 0 and not rules.globally_white(ip):
            detail = f"too many failed authentications from {ip}; retry in {wait:.1f} s"
            acl.denied(
                self.log,
                protocol="remoting",
                peer=peer,
                access_key=access_key,
                reason="throttled",
                detail=detail,
                emit=False,
            )
            return Reply(ResponseCode.NO_PERMISSION, remark=detail)
        verdict = auth.authorize(rules, request, ip)
        if verdict.authenticated:
            acl.throttle.succeeded(ip)
        if verdict.allowed:
            return None
        reason = verdict.reason or "no_permission"
        if reason in AUTHENTICATION_FAILURES:
            acl.throttle.failed(ip, now)
        acl.denied(
            self.log,
            protocol="remoting",
            peer=peer,
            access_key=verdict.access_key,
            reason=reason,
            detail=verdict.detail,
        )
        return Reply(ResponseCode.NO_PERMISSION, remark=verdict.detail)

    def reject(self, request: RemotingCommand, code: ResponseCode, remark: str) -> Handled:
        """Answer ``request`` with an error without running its handler (e.g. overload)."""
        return self._handled(request, Reply(code, remark=remark), Note())

    def _handled(self, request: RemotingCommand, reply: Reply, note: Note) -> Handled:
        if request.is_oneway:
            response, outcome = None, "oneway"
        else:
            response = self._response(request, reply)
            outcome = "ok" if reply.code in _OK_CODES else "error"
        return Handled(
            response=response,
            op=op_name(request.code),
            code=request.code,
            status=status_name(reply.code),
            outcome=outcome,
            client_id=self.client_id,
            client_version=self.client_version,
            group=note.group,
            topic=note.topic,
        )

    async def handle(self, request: RemotingCommand, *, req_bytes: int = 0) -> RemotingCommand | None:
        """Dispatch and report the ``request`` event; the response, or None for oneway requests."""
        started = trio.current_time()
        handled = await self.dispatch(request)
        resp_bytes = 0 if handled.response is None else len(encode_command(handled.response))
        latency_ms = max(0.0, (trio.current_time() - started) * 1000.0)
        self.on_request(handled.event(latency_ms=latency_ms, req_bytes=req_bytes, resp_bytes=resp_bytes))
        return handled.response

    async def _run(self, handler: Handler, request: RemotingCommand, note: Note) -> Reply:
        try:
            return await handler(self, request, note)
        except RequestError as exc:
            return Reply(exc.code, remark=exc.remark)
        except WouldWait:
            raise
        except BackendError as exc:
            return backend_error_reply(exc)
        except Exception as exc:  # a handler bug must not kill the connection
            self.log.error("internal.error", exc_info=exc, op=op_name(request.code), client_id=self.client_id)
            return Reply(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}"[:512])

    def _response(self, request: RemotingCommand, reply: Reply) -> RemotingCommand:
        ext = reply.ext
        ext["MSG_REGION"] = self.ctx.region
        ext["TRACE_ON"] = "true" if self.ctx.trace_on else "false"
        response = RemotingCommand.response_to(request, int(reply.code), reply.remark, ext, reply.body)
        response.version = self.ctx.server_version
        return response

    # --- lifecycle -------------------------------------------------------------------------------
    async def close(self) -> None:
        """The connection ended: release its queue locks, forget its producer groups, unregister its
        consumers and notify the groups' other members.

        Idempotent. A membership another connection has taken over (client reconnected) is left alone.
        """
        if self._closed:
            return
        self._closed = True
        for group, client_id in self.lock_holders:
            await self.broker.release_client(group, client_id)
        self.lock_holders.clear()
        for group in self.producer_groups:
            if self.ctx.groups.leave_producer(group, self.conn):
                self.broker.announce_producer(group, present=False)
        self.producer_groups.clear()
        for group, client_id in sorted(self.memberships):
            if not self.ctx.groups.leave(group, client_id, self.conn):
                continue
            try:
                changed = await self.broker.unregister_consumer(group, client_id)
            except BackendError:
                continue
            if changed:
                self.ctx.groups.notify_changed(group, self.conn)
        self.memberships.clear()
