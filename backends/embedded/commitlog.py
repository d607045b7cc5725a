"""Append-only, segmented commit log of CRC-framed records.

Frame layout (big-endian): ``>I total_length`` (header included), ``>I crc32``, payload. The CRC is
``zlib.crc32`` over the length field then the payload, so a torn length is detected too.

Segments are files named by the 20-digit global offset of their first byte
(``00000000000000000000``, ``00000000000001048576``, ...). A record's *offset* is the global byte
offset of its frame: unique, dense across segments and stable across restarts. A record never spans
two segments: an append that does not fit in the current segment starts a new one (a record larger
than a whole segment gets a segment of its own).

Blocking file I/O; the caller decides where it runs. Writes are plain ``os.pwrite`` (they survive the
process being killed); :meth:`CommitLog.sync` makes them survive an OS crash.
"""

from __future__ import annotations

import bisect
import errno
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from mqproxy.model.errors import StoreUnavailable

FRAME_HEADER = struct.Struct(">II")
HEADER_SIZE = FRAME_HEADER.size
#: Largest frame recovery accepts; anything bigger is treated as corruption.
MAX_FRAME_BYTES = 64 * 1024 * 1024
_NAME_DIGITS = 20
#: Payloads :meth:`CommitLog.payload_at` keeps (a pull of a batch reads its base once).
_RECENT_LIMIT = 32

#: ``on_record(offset, frame_size, payload)``, called by :meth:`CommitLog.open` for each recovered record.
RecordSink = Callable[[int, int, bytes], None]


def frame(payload: bytes) -> bytes:
    length = HEADER_SIZE + len(payload)
    length_b = length.to_bytes(4, "big")
    crc = zlib.crc32(payload, zlib.crc32(length_b))
    return length_b + crc.to_bytes(4, "big") + payload


def segment_name(base: int) -> str:
    return f"{base:0{_NAME_DIGITS}d}"


@dataclass(slots=True)
class ScanResult:
    """What :meth:`CommitLog.open` found while scanning the tail."""

    records: int
    truncated_bytes: int
    end: int


class CommitLog:
    """The segment files of one directory; open with :meth:`open`."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._bases: list[int] = []
        self._fds: list[int] = []
        self._end = 0  # global offset one past the last valid record
        self._dirty: set[int] = set()  # fds written since the last sync
        self._closed = False
        self._recent: dict[int, bytes] = {}  # offset -> payload read by payload_at

    # --- opening and recovery -------------------------------------------------------------------
    @classmethod
    def open(
        cls, directory: Path, segment_bytes: int, scan_from: int, on_record: RecordSink | None = None
    ) -> tuple[CommitLog, ScanResult]:
        """Open (creating) the log, verify every record from the segment holding ``scan_from`` on,
        and cut the log at the first torn or corrupt frame (later segments are deleted).

        ``on_record(offset, size, payload)`` is called for every valid record at or after
        ``scan_from``. If ``scan_from`` lies beyond the valid end, scanning starts at the end.
        """
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(directory, segment_bytes)
        bases = sorted(
            int(p.name) for p in directory.iterdir() if p.name.isdigit() and len(p.name) == _NAME_DIGITS
        )
        if not bases:
            bases = [0]
            log._create_segment_file(0)
        for base in bases:
            log._bases.append(base)
            log._fds.append(os.open(directory / segment_name(base), os.O_RDWR | os.O_CREAT, 0o644))
        try:
            result = log._recover(scan_from, on_record)
        except BaseException:
            log.close()
            raise
        return log, result

    def _recover(self, scan_from: int, on_record: RecordSink | None) -> ScanResult:
        # Segments must be contiguous: each base equals the previous base + its size.
        index = max(0, bisect.bisect_right(self._bases, scan_from) - 1)
        records = truncated = 0
        for i in range(index, len(self._bases)):
            base = self._bases[i]
            size = os.fstat(self._fds[i]).st_size
            valid, count = self._scan_segment(i, scan_from, on_record)
            records += count
            is_last = i == len(self._bases) - 1
            next_ok = is_last or self._bases[i + 1] == base + valid
            if valid < size or not next_ok:
                truncated += size - valid
                os.ftruncate(self._fds[i], valid)
                for j in range(i + 1, len(self._bases)):
                    truncated += os.fstat(self._fds[j]).st_size
                    os.close(self._fds[j])
                    os.unlink(self.directory / segment_name(self._bases[j]))
                del self._bases[i + 1 :], self._fds[i + 1 :]
                os.fsync(self._fds[i])
                self._fsync_directory()
                break
        last = len(self._bases) - 1
        self._end = self._bases[last] + os.fstat(self._fds[last]).st_size
        return ScanResult(records, truncated, self._end)

    def _scan_segment(self, i: int, scan_from: int, on_record: RecordSink | None) -> tuple[int, int]:
        """Return (bytes of valid records from the segment start, records seen) for segment ``i``."""
        base = self._bases[i]
        count = 0
        pos = 0
        with open(self.directory / segment_name(base), "rb", buffering=1024 * 1024) as f:
            while True:
                header = f.read(HEADER_SIZE)
                if len(header) < HEADER_SIZE:
                    return pos, count
                length, crc = FRAME_HEADER.unpack(header)
                if not HEADER_SIZE < length <= MAX_FRAME_BYTES:
                    return pos, count
                payload = f.read(length - HEADER_SIZE)
                if len(payload) != length - HEADER_SIZE or zlib.crc32(payload, zlib.crc32(header[:4])) != crc:
                    return pos, count
                count += 1
                if on_record is not None and base + pos >= scan_from:
                    on_record(base + pos, length, payload)
                pos += length

    # --- writing --------------------------------------------------------------------------------
    @property
    def end(self) -> int:
        """Global offset where the next record will go."""
        return self._end

    def append(self, payloads: Sequence[bytes]) -> list[tuple[int, int]]:
        """Append records with one write; return each record's (offset, frame size).

        All-or-nothing: on any I/O error (a full disk included) the segment is cut back to where it was, so
        no torn frame stays behind, and StoreUnavailable is raised (its ``__cause__`` is the OSError).
        """
        self._check_open()
        # the frames built in one list and joined once (what frame() gives, without a copy per record)
        parts: list[bytes] = []
        sizes: list[int] = []
        crc32, header = zlib.crc32, HEADER_SIZE
        for payload in payloads:
            size = header + len(payload)
            length_b = size.to_bytes(4, "big")
            parts += (length_b, crc32(payload, crc32(length_b)).to_bytes(4, "big"), payload)
            sizes.append(size)
        total = sum(sizes)
        fd = self._fds[-1]
        used = self._end - self._bases[-1]
        if used and used + total > self.segment_bytes:
            fd = self._roll()
            used = 0
        data = b"".join(parts)
        try:
            written = 0
            while written < len(data):  # a short write is retried: a full disk then raises ENOSPC
                n = os.pwrite(fd, data[written:] if written else data, used + written)
                if n <= 0:
                    raise OSError(errno.ENOSPC, f"short write: {written} of {len(data)} bytes")
                written += n
        except OSError as exc:
            try:
                os.ftruncate(fd, used)
            except OSError:
                pass
            raise StoreUnavailable(f"commit log write failed: {exc}") from exc
        self._dirty.add(fd)
        out = []
        offset = self._end
        for size in sizes:
            out.append((offset, size))
            offset += size
        self._end = offset
        return out

    def truncate_to(self, offset: int) -> None:
        """Drop everything from ``offset`` on within the current segment (undo an unacknowledged append)."""
        base = self._bases[-1]
        if not base <= offset <= self._end:
            raise ValueError("can only cut back inside the current segment")
        os.ftruncate(self._fds[-1], offset - base)
        self._end = offset
        self._recent.clear()

    def _roll(self) -> int:
        base = self._end
        self._create_segment_file(base)
        fd = os.open(self.directory / segment_name(base), os.O_RDWR, 0o644)
        self._bases.append(base)
        self._fds.append(fd)
        return fd

    def _create_segment_file(self, base: int) -> None:
        fd = os.open(self.directory / segment_name(base), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        self._fsync_directory()

    def _fsync_directory(self) -> None:
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def take_dirty(self) -> list[int]:
        """The fds written since the last call; the caller syncs them (see :func:`sync_fds`)."""
        dirty, self._dirty = list(self._dirty), set()
        return dirty

    def sync(self) -> None:
        sync_fds(self.take_dirty())

    # --- reading --------------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        """The payload of the record at ``offset`` whose frame is ``size`` bytes (CRC verified)."""
        self._check_open()
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or offset + size > self._end:
            raise StoreUnavailable(f"commit-log offset {offset} is outside the log")
        data = os.pread(self._fds[i], size, offset - self._bases[i])
        if len(data) != size:
            raise StoreUnavailable(f"short read at commit-log offset {offset}")
        length, crc = FRAME_HEADER.unpack_from(data)
        if length != size or zlib.crc32(data[HEADER_SIZE:], zlib.crc32(data[:4])) != crc:
            raise StoreUnavailable(f"corrupt record at commit-log offset {offset}")
        return data[HEADER_SIZE:]

    def read_at(self, offset: int) -> tuple[int, bytes] | None:
        """(frame size, payload) of the record starting at ``offset``, or None if none starts there."""
        self._check_open()
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or not 0 <= offset < self._end:
            return None
        header = os.pread(self._fds[i], HEADER_SIZE, offset - self._bases[i])
        if len(header) < HEADER_SIZE:
            return None
        length, crc = FRAME_HEADER.unpack(header)
        if not HEADER_SIZE < length <= min(MAX_FRAME_BYTES, self._end - offset):
            return None
        data = os.pread(self._fds[i], length - HEADER_SIZE, offset - self._bases[i] + HEADER_SIZE)
        if zlib.crc32(data, zlib.crc32(header[:4])) != crc:
            return None
        return length, data

    def payload_at(self, offset: int) -> bytes:
        """The payload of the record at ``offset`` (the base of a SHARED record), from a small cache of
        the last ones read; raise StoreUnavailable if no valid record starts there."""
        payload = self._recent.get(offset)
        if payload is None:
            found = self.read_at(offset)
            if found is None:
                raise StoreUnavailable(f"no record at commit-log offset {offset}")
            payload = found[1]
            if len(self._recent) >= _RECENT_LIMIT:
                self._recent.clear()
            self._recent[offset] = payload
        return payload

    def iter_records(self, start: int = 0) -> Iterator[tuple[int, int, bytes]]:
        """Every record at or after ``start`` (a record boundary) as (offset, frame size, payload).

        CRC-verified; a corrupt frame raises StoreUnavailable.
        """
        i = max(0, bisect.bisect_right(self._bases, start) - 1)
        for j in range(i, len(self._bases)):
            base = self._bases[j]
            end = self._bases[j + 1] if j + 1 < len(self._bases) else self._end
            pos = max(start, base)
            while pos < end:
                header = os.pread(self._fds[j], HEADER_SIZE, pos - base)
                length = FRAME_HEADER.unpack(header)[0] if len(header) == HEADER_SIZE else 0
                if not HEADER_SIZE < length <= end - pos:
                    raise StoreUnavailable(f"corrupt frame header at commit-log offset {pos}")
                yield pos, length, self.read(pos, length)
                pos += length

    def segment_bases(self) -> list[int]:
        return list(self._bases)

    @property
    def start(self) -> int:
        """Global offset of the oldest record kept (base of the first segment)."""
        return self._bases[0]

    def segments(self) -> list[tuple[int, int, int]]:
        """Every segment as (base, size in bytes, last modification ms), oldest first."""
        out = []
        for i, (base, fd) in enumerate(zip(self._bases, self._fds, strict=True)):
            end = self._bases[i + 1] if i + 1 < len(self._bases) else self._end
            out.append((base, end - base, os.fstat(fd).st_mtime_ns // 1_000_000))
        return out

    def segment_records(self, base: int, chunk: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
        """Every record of the sealed segment starting at ``base`` as (offset, payload), read in
        ``chunk``-byte preads (blocking; safe in a worker thread: a sealed segment never changes and only
        :meth:`drop_segments` closes its fd). CRCs are not re-checked (recovery did)."""
        i = self._bases.index(base)
        end = self._bases[i + 1] - base
        fd = self._fds[i]
        buffer = b""
        buffered_at = 0  # segment position of buffer[0]
        pos = 0
        while pos < end:
            if pos + HEADER_SIZE > buffered_at + len(buffer):
                buffer, buffered_at = os.pread(fd, max(chunk, HEADER_SIZE), pos), pos
            (length,) = struct.unpack_from(">I", buffer, pos - buffered_at)
            if length <= HEADER_SIZE or pos + length > end:
                raise StoreUnavailable(f"corrupt frame at commit-log offset {base + pos}")
            if pos + length > buffered_at + len(buffer):
                buffer, buffered_at = os.pread(fd, max(chunk, length), pos), pos
            start = pos - buffered_at
            yield base + pos, buffer[start + HEADER_SIZE : start + length]
            pos += length

    def detach_segments(self, below: int) -> list[Path]:
        """Forget every segment that ends at or before ``below`` (a segment base), never the one being
        written: close its fd and return its path for :func:`unlink_segments` (reads of its offsets find
        nothing from now on). The caller makes sure no fdatasync of those fds is running in a thread."""
        self._check_open()
        paths: list[Path] = []
        self._recent.clear()
        while len(self._bases) > 1 and self._bases[1] <= below:
            base = self._bases.pop(0)
            fd = self._fds.pop(0)
            self._dirty.discard(fd)
            os.close(fd)
            paths.append(self.directory / segment_name(base))
        return paths

    def drop_segments(self, below: int) -> list[Path]:
        """:meth:`detach_segments` and :func:`unlink_segments` in one (blocking) call."""
        paths = self.detach_segments(below)
        unlink_segments(paths)
        return paths

    # --- closing --------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("commit log is closed")


def read_payload(directory: Path, offset: int) -> bytes:
    """The payload of the record at global ``offset`` in the log in ``directory``, read without opening
    the log (recovery, while :meth:`CommitLog.open` scans); raise StoreUnavailable if none is there."""
    bases = sorted(
        int(p.name) for p in directory.iterdir() if p.name.isdigit() and len(p.name) == _NAME_DIGITS
    )
    i = bisect.bisect_right(bases, offset) - 1
    if i < 0:
        raise StoreUnavailable(f"no record at commit-log offset {offset}")
    with open(directory / segment_name(bases[i]), "rb") as f:
        f.seek(offset - bases[i])
        header = f.read(HEADER_SIZE)
        length, crc = FRAME_HEADER.unpack(header) if len(header) == HEADER_SIZE else (0, 0)
        payload = f.read(length - HEADER_SIZE) if HEADER_SIZE < length <= MAX_FRAME_BYTES else b""
    if (
        not payload
        or len(payload) != length - HEADER_SIZE
        or zlib.crc32(payload, zlib.crc32(header[:4])) != crc
    ):
        raise StoreUnavailable(f"no record at commit-log offset {offset}")
    return payload


def sync_fds(fds: Sequence[int]) -> None:
    """fdatasync every fd (releases the GIL; may run in a worker thread)."""
    for fd in fds:
        os.fdatasync(fd)


def unlink_segments(paths: Sequence[Path]) -> None:
    """Delete detached segment files and make that durable (blocking; may run in a worker thread)."""
    for path in paths:
        path.unlink()
    if paths:
        dfd = os.open(paths[0].parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
