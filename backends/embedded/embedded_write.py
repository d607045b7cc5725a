"""The embedded store's write path: validate, coalesce, append to the commit log, index, wake readers.

Every send queued in the same scheduler turn, from any connection, is written together by
:meth:`EmbeddedWriting._append`, on the trio thread with no awaits in between (so no lock): assign
queue offsets (and LMQ offsets), append all records with one ``os.pwrite``, index them and advance the
dispatch checkpoint in one LMDB transaction, then wake each touched queue's waiters once. A send whose
records cannot be encoded fails alone; a failed write or index commit fails every send of the batch and
leaves nothing behind (a torn write is cut back). A write that failed for lack of space (or on a failing
device) makes the store refuse writes with :class:`~mqproxy.model.errors.StoreFull` until
:mod:`.embedded_retention` sees the disk recover.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from mqproxy.backends.embedded.built import send_result, stored_message
from mqproxy.backends.embedded.cq_entry import QID, TAIL, offset_prefix, tail_fields
from mqproxy.backends.embedded.embedded_core import PendingSend, tag_hash
from mqproxy.backends.embedded.embedded_recovery import EmbeddedRecovery
from mqproxy.backends.embedded.index import key_rows, queue_key
from mqproxy.backends.embedded.records import SharedBases, body_crc, encode_message
from mqproxy.backends.embedded.sending import (
    check_batch,
    check_messages,
    index_keys,
    stored_base,
    stored_properties,
)
from mqproxy.model.errors import StoreUnavailable
from mqproxy.model.topics import LMQ_QUEUE_ID
from mqproxy.model.types import (
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    Message,
    SendResult,
    StoredMessage,
)

#: What a message that had a reader waiting becomes once written: its fields but the log position.
_Fresh = tuple[Message, dict[str, str], bytes]
#: One encoded message: its queue's ``cqd`` key, queue offset, its LMQs' ``cqd`` keys and offsets, LMQ
#: offsets by name, tag hash, the keys it is indexed by, and for the hand-off to waiting readers what it is
#: made of (or None).
_LMQ_KEYS = frozenset((PROPERTY_INNER_MULTI_DISPATCH, PROPERTY_INNER_MULTI_QUEUE_OFFSET))
_Planned = tuple[
    bytes, int, tuple[bytes, ...], list[int], dict[str, int], int, tuple[str, ...], _Fresh | None
]
#: The queue ids of a dispatch list (in its order) and their ``cqd`` keys, found once per append.
_LmqIds = tuple[tuple[int, ...], tuple[bytes, ...]]
#: An LMQ's run of handed-off messages in one append: its first LMQ offset and the messages from there
#: (consecutive offsets; None once a gap was seen).
_Run = tuple[int, list[StoredMessage]]
_NO_RUNS: dict[str, _Run | None] = {}
_NO_RUN: _Run = (-1, [])  # a sentinel: no run yet  # never mutated: the value outside a write's notify


class EmbeddedWriting(EmbeddedRecovery):
    """``send_batch`` and the coalesced append behind it."""

    # Re-declared for mypy, which sees the layer below as Any (mqproxy is an editable install).
    _next_qid: int
    #: While a write notifies its readers: each LMQ's run of the messages it handed off (by LMQ name), for
    #: :meth:`~mqproxy.backends.embedded.embedded_read.EmbeddedReading.pull_now` to answer from without
    #: the index. Empty otherwise.
    _written: dict[str, _Run | None] = _NO_RUNS

    async def send_batch(self, messages: Sequence[Message]) -> list[SendResult]:
        self._check_writable()
        check_batch(messages)
        targets = check_messages(messages, self._max_message_bytes)
        try:
            config = self._config_for_send(messages[0].topic)  # may create the topic in the index
        except StoreUnavailable as exc:
            self._write_failed(exc)  # the index could not grow (a full disk): refuse like the log
            if self._refusal is not None:
                raise self._refusal from exc
            raise
        queue_id = self._topics.pick_queue(config, messages[0].queue_id)
        results, end = await self._writes.submit((config.name, queue_id, messages, targets))
        if self.flush == "sync":
            await self._wait_durable(end)
        return results

    def _append(self, sends: Sequence[PendingSend]) -> list[tuple[list[SendResult], int] | BaseException]:
        """Store and index validated sends (queued by concurrent callers) with one ``pwrite`` and one
        index transaction; return each send's results and the log end, or its own error.

        A send whose records cannot be encoded fails alone. A failed write or index commit raises (every
        send fails) and leaves nothing behind: records cut off, new queue ids forgotten.
        """
        self._check_writable()
        new_queues: dict[bytes, int] = {}
        next_qid_before = self._next_qid
        next_offsets: dict[int, int] = {}  # queue id -> next offset, for sends already encoded
        qids: dict[bytes, int] = {}
        lmq_qids: dict[str, int] = {}
        store_ts = self._clock.now_ms()  # one store time per write keeps every queue's times sorted
        payloads: list[bytes] = []
        plans: list[list[_Planned] | Exception] = []
        shared = SharedBases()  # records repeating an earlier one's fields refer to it
        lmq_ids: dict[tuple[str, ...], _LmqIds] = {}  # a dispatch list's queue ids, looked up once

        def qid_of(key: bytes) -> int:
            qid = qids.get(key)
            if qid is None:
                qid = qids[key] = self._qid_for_write(key, new_queues)
            return qid

        def lmqs_of(names: tuple[str, ...]) -> _LmqIds:
            found = lmq_ids.get(names)
            if found is None:
                ids = []
                for name in names:
                    qid = lmq_qids.get(name)
                    if qid is None:
                        qid = lmq_qids[name] = qid_of(queue_key(name, LMQ_QUEUE_ID))
                    ids.append(qid)
                found = lmq_ids[names] = (tuple(ids), tuple(QID.pack(q) for q in ids))
            return found

        for topic, queue_id, messages, targets in sends:
            taken: dict[int, int] = {}  # this send's offsets, merged once it encoded

            def assign(qid: int, taken: dict[int, int] = taken) -> int:
                offset = taken.get(qid)
                if offset is None:
                    offset = next_offsets.get(qid)
                    if offset is None:
                        offset = self._next_offset(qid)
                taken[qid] = offset + 1
                return offset

            mark, position = len(payloads), shared.position
            try:
                encoded = self._encode(
                    topic, queue_id, messages, targets, qid_of, lmqs_of, assign, store_ts, payloads, shared
                )
            except Exception as exc:
                del payloads[mark:]
                shared.rollback(position)
                plans.append(exc)
                continue
            next_offsets.update(taken)
            plans.append(encoded)
        if not payloads:
            return [p for p in plans if isinstance(p, Exception)]
        start = self._log.end
        try:
            positions = iter(self._log.append(payloads))
            rows: list[tuple[bytes, bytes]] = []  # packed consume-queue rows
            keys: list[bytes] = []
            answers: list[tuple[list[SendResult], int] | BaseException] = []
            end = self._log.end
            handoff: list[StoredMessage] = []
            runs: dict[str, _Run | None] = {}
            pack_offset = offset_prefix
            pack_tail = TAIL.pack
            ts_hi, ts_lo = tail_fields(end, store_ts)  # every record lies below the log's end
            store_host = self._store_host
            for (topic, queue_id, _, _), plan in zip(sends, plans, strict=True):
                if isinstance(plan, Exception):
                    answers.append(plan)
                    continue
                results: list[SendResult] = []
                for key, queue_offset, lmq_keys, lmq_offsets, lmq_map, code, message_keys, fresh in plan:
                    clo, size = next(positions)
                    if fresh is not None:
                        message, properties, body = fresh  # what a decode of the record would give
                        handed = stored_message(
                            topic,
                            queue_id,
                            queue_offset,
                            clo,
                            size,
                            body,
                            message.flag,
                            properties,
                            message.sys_flag,
                            message.born_timestamp_ms,
                            message.born_host,
                            store_ts,
                            store_host,
                            message.reconsume_times,
                            body_crc(body),
                        )
                        handoff.append(handed)
                        for name, loff in lmq_map.items():
                            run = runs.get(name, _NO_RUN)
                            if run is _NO_RUN:
                                runs[name] = (loff, [handed])
                            elif run is not None:
                                if run[0] + len(run[1]) == loff:
                                    run[1].append(handed)
                                else:
                                    runs[name] = None  # not consecutive: pulls read the index
                    elif lmq_map and runs:
                        for name in lmq_map:
                            if name in runs:
                                runs[name] = None  # a message of the run was not handed off
                    # the row's tail (row_tail): the same for the queue and its LMQs
                    tail = pack_tail(clo >> 32, clo & 0xFFFFFFFF, size, code, ts_hi, ts_lo)
                    rows.append((key, pack_offset(queue_offset) + tail))
                    if message_keys:
                        keys.extend(key_rows(topic, message_keys, store_ts, clo))
                    for lmq_key, loff in zip(lmq_keys, lmq_offsets, strict=True):
                        rows.append((lmq_key, pack_offset(loff) + tail))
                    results.append(send_result(topic, queue_id, queue_offset, clo, store_ts, lmq_map))
                answers.append((results, end))
            self._index.commit(rows, new_queues.items(), self._next_qid, end, store_ts, keys)
        except BaseException as exc:
            # Nothing was acknowledged: forget the records and the queue ids allocated for them.
            if self._log.end != start:
                self._log.truncate_to(start)
            self._next_qid = next_qid_before
            for key, qid in new_queues.items():
                self._qids.pop(key, None)
                self._next_offsets.pop(qid, None)
            if isinstance(exc, OSError | StoreUnavailable):
                # a full disk or a failing device: refuse writes until it recovers (one event)
                self._write_failed(exc)
                if self._refusal is not None:
                    raise self._refusal from exc
            if isinstance(exc, OSError):
                raise StoreUnavailable(f"commit log write failed: {exc}") from exc
            raise
        self._index_dirty = True
        if handoff:
            self._handoff.put_many(handoff)
        store = self._next_offsets.store
        for qid, offset in next_offsets.items():
            store(qid, offset)
        notify = self._waiters.notify
        for (topic, queue_id, _, _), plan in zip(sends, plans, strict=True):
            if not isinstance(plan, Exception):
                notify((topic, queue_id))
        self._written = runs
        try:
            for name in lmq_qids:
                notify((name, LMQ_QUEUE_ID))
        finally:
            self._written = _NO_RUNS
        return answers

    def _encode(
        self,
        topic: str,
        queue_id: int,
        messages: Sequence[Message],
        targets: list[tuple[str, ...]],
        qid_of: Callable[[bytes], int],
        lmqs_of: Callable[[tuple[str, ...]], _LmqIds],
        assign: Callable[[int], int],
        store_ts: int,
        payloads: list[bytes],
        shared: SharedBases,
    ) -> list[_Planned]:
        """Assign offsets to one send's messages and append their records to ``payloads`` (written in that
        order by one append: ``shared`` knows the records before them)."""
        parent = qid_of(queue_key(topic, queue_id))
        parent_key = QID.pack(parent)
        plan: list[_Planned] = []
        awaited = self._waiters.awaited
        now = time.monotonic()
        parent_waited = awaited((topic, queue_id), now)
        waited_by: dict[tuple[str, ...], bool] = {}  # dispatch list -> a reader waits on one of its LMQs
        dispatch_of: dict[tuple[str, ...], str] = {}  # dispatch list -> its stored property
        no_keys: tuple[bytes, ...] = ()
        for message, lmqs in zip(messages, targets, strict=True):
            queue_offset = assign(parent)
            properties = message.properties
            body = message.body if type(message.body) is bytes else bytes(message.body)
            if lmqs:
                lqids, lmq_keys = lmqs_of(lmqs)
                lmq_offsets = [assign(lqid) for lqid in lqids]
                lmq_list = list(zip(lmqs, lmq_offsets, strict=True))
                lmq_map = dict(lmq_list)
                if _LMQ_KEYS.isdisjoint(properties):
                    # the record derives the two LMQ properties stored_properties appends
                    record_properties = properties if "WAIT" not in properties else stored_base(properties)
                    hint: bool | None = True
                else:
                    record_properties = stored_properties(properties, lmqs, lmq_offsets)
                    hint = None
            else:
                lmq_keys, lmq_list, lmq_map, lmq_offsets = no_keys, [], {}, []
                record_properties, hint = properties, None
            waited = parent_waited
            if not waited and lmqs:
                found = waited_by.get(lmqs)
                if found is None:
                    found = waited_by[lmqs] = any(awaited((name, LMQ_QUEUE_ID), now) for name in lmqs)
                waited = found
            payloads.append(
                encode_message(
                    topic=topic,
                    queue_id=queue_id,
                    queue_offset=queue_offset,
                    flag=message.flag,
                    sys_flag=message.sys_flag,
                    born_timestamp_ms=message.born_timestamp_ms,
                    store_timestamp_ms=store_ts,
                    reconsume_times=message.reconsume_times,
                    born_host=message.born_host,
                    lmqs=lmq_list,
                    properties=record_properties,
                    body=body,
                    lmq_properties=hint,
                    shared=shared,
                )
            )
            fresh: _Fresh | None = None
            if waited:
                stored = dict(record_properties)
                if hint:  # what stored_properties gives: the two LMQ properties after the others
                    joined = dispatch_of.get(lmqs)
                    if joined is None:
                        joined = dispatch_of[lmqs] = ",".join(lmqs)
                    stored[PROPERTY_INNER_MULTI_DISPATCH] = joined
                    stored[PROPERTY_INNER_MULTI_QUEUE_OFFSET] = (
                        f"{lmq_offsets[0]},{lmq_offsets[1]}"
                        if len(lmq_offsets) == 2
                        else ",".join(map(str, lmq_offsets))
                    )
                fresh = (message, stored, body)
            plan.append(
                (
                    parent_key,
                    queue_offset,
                    lmq_keys,
                    lmq_offsets,
                    lmq_map,
                    tag_hash(tag) if (tag := properties.get(PROPERTY_TAGS)) else 0,
                    (
                        index_keys(properties)
                        if PROPERTY_KEYS in properties or PROPERTY_UNIQ_KEY in properties
                        else ()
                    ),
                    fresh,
                )
            )
        return plan
