"""Pull-range semantics shared by backends (spec §3.3 table; maxOffset = next offset to be written)."""

from __future__ import annotations

from mqproxy.model.types import PullResult, PullStatus

#: Entries a filtered pull examines at most before answering NO_MATCHED_MSG / a short FOUND.
MAX_SCAN_ENTRIES = 2048


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
