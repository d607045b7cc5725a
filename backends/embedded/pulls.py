"""Pull-range semantics shared by backends (spec §3.3 table; maxOffset = next offset to be written)."""

from __future__ import annotations

from collections.abc import Callable

from mqproxy.codecs.record_patch import RecordBody
from mqproxy.model.types import PullResult, PullStatus, StoredMessage, TagFilter

#: Entries a filtered pull examines at most before answering NO_MATCHED_MSG / a short FOUND.
MAX_SCAN_ENTRIES = 2048

#: ``scan(offset, max_count, tag_filter, max_bytes) -> (messages, next offset)``: reads a queue from a
#: readable ``offset``, at most ``max_count`` (>= 1) messages matching ``tag_filter`` and, past the first,
#: within ``max_bytes``; the next offset is one past the last entry examined.
PullScan = Callable[[int, int, TagFilter | None, int], tuple[list[StoredMessage], int]]

#: ``scan(offset, max_count, max_bytes) -> (records, next offset)``: :data:`PullScan` without a filter,
#: each message as the V1 record a remoting pull body carries; None when one of them is not for this
#: path (the caller pulls again the general way).
WireScan = Callable[[int, int, int], "tuple[list[bytes], int] | None"]


def out_of_range(offset: int, min_offset: int, max_offset: int) -> PullResult | None:
    """The answer for a pull whose ``offset`` has nothing to read, or None if ``offset`` is readable."""

    def result(status: PullStatus, next_offset: int) -> PullResult:
        return PullResult(status, (), next_offset, min_offset, max_offset)

    if max_offset <= min_offset:  # empty queue
        if offset == max_offset:
            return result(PullStatus.NO_NEW_MSG, offset)
        return result(PullStatus.OFFSET_ILLEGAL, max_offset)
    if offset < min_offset:
        return result(PullStatus.OFFSET_ILLEGAL, min_offset)
    if offset == max_offset:
        return result(PullStatus.NO_NEW_MSG, offset)
    if offset > max_offset:
        return result(PullStatus.OFFSET_ILLEGAL, max_offset)
    return None


def read_pull(
    scan: PullScan,
    min_offset: int,
    max_offset: int,
    offset: int,
    max_count: int,
    tag_filter: TagFilter | None,
    max_bytes: int,
) -> PullResult:
    """A pull of a queue holding ``[min_offset, max_offset)``: the out-of-range answer, else what ``scan``
    reads (FOUND, or NO_MATCHED_MSG when the filter rejected everything it examined)."""
    early = out_of_range(offset, min_offset, max_offset)
    if early is not None:
        return early
    found, next_offset = scan(offset, max(max_count, 1), tag_filter, max_bytes)
    status = PullStatus.FOUND if found else PullStatus.NO_MATCHED_MSG
    return PullResult(status, tuple(found), next_offset, min_offset, max_offset)


def read_wire_pull(
    scan: WireScan, min_offset: int, max_offset: int, offset: int, max_count: int, max_bytes: int
) -> PullResult | None:
    """:func:`read_pull` without a filter, the messages kept as a pull body
    (:meth:`~mqproxy.model.types.PullResult.of_records`); None when ``scan`` declines or finds nothing."""
    early = out_of_range(offset, min_offset, max_offset)
    if early is not None:
        return early
    scanned = scan(offset, max(max_count, 1), max_bytes)
    if scanned is None or not scanned[0]:
        return None
    records, next_offset = scanned
    body = RecordBody(b"".join(records))
    return PullResult.of_records(PullStatus.FOUND, body, next_offset, min_offset, max_offset)
