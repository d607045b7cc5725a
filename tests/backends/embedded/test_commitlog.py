"""Commit-log framing, segments, recovery scan, and the store's record codec."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqproxy.backends.embedded.commitlog import CommitLog, frame, segment_name
from mqproxy.backends.embedded.records import decode_message, encode_message
from mqproxy.model.errors import StoreUnavailable

SEG = 4096


def payloads(n: int, size: int = 100) -> list[bytes]:
    return [bytes([i % 251]) * size for i in range(n)]


def open_log(path: Path, scan_from: int = 0) -> tuple[CommitLog, list[tuple[int, int, bytes]], int]:
    seen: list[tuple[int, int, bytes]] = []
    log, scan = CommitLog.open(path, SEG, scan_from, lambda o, s, p: seen.append((o, s, p)))
    return log, seen, scan.truncated_bytes


def test_frame_golden_bytes() -> None:
    # length 11 (8-byte header + "abc"), crc32 over the length field then the payload
    assert frame(b"abc") == b"\x00\x00\x00\x0b\x80\x08\xc0\xafabc"
    assert segment_name(1048576) == "00000000000001048576"


def test_append_read_and_dense_offsets(tmp_path: Path) -> None:
    log, seen, truncated = open_log(tmp_path)
    assert (seen, truncated, log.end) == ([], 0, 0)
    positions = log.append(payloads(3))
    assert positions == [(0, 108), (108, 108), (216, 108)]
    assert log.read(108, 108) == payloads(3)[1]
    assert log.end == 324
    log.close()
    with pytest.raises(StoreUnavailable):
        log.read(0, 108)


def test_segments_roll_and_reopen(tmp_path: Path) -> None:
    log, _, _ = open_log(tmp_path)
    positions = [log.append([p])[0] for p in payloads(100, 400)]
    bases = log.segment_bases()
    assert len(bases) > 5
    assert bases[0] == 0
    assert sorted(os.listdir(tmp_path)) == [segment_name(b) for b in bases]
    for base in bases[1:]:
        assert base in {o for o, _ in positions}, "a segment starts at a record"
    end = log.end
    log.close()
    log, seen, truncated = open_log(tmp_path)
    assert truncated == 0
    assert log.end == end
    assert [o for o, _, _ in seen] == [o for o, _ in positions], "scan_from=0 re-reads every segment"
    assert all(log.read(o, s) == payloads(100, 400)[i] for i, (o, s) in enumerate(positions))
    assert [o for o, _, _ in log.iter_records(positions[50][0])] == [o for o, _ in positions[50:]]
    log.close()


def test_scan_starts_at_the_checkpoint_segment(tmp_path: Path) -> None:
    log, _, _ = open_log(tmp_path)
    positions = [log.append([p])[0] for p in payloads(40, 400)]
    log.close()
    checkpoint = positions[30][0]
    log, seen, _ = open_log(tmp_path, checkpoint)
    assert [o for o, _, _ in seen] == [o for o, _ in positions[30:]]
    log.close()


def test_oversized_record_gets_its_own_segment(tmp_path: Path) -> None:
    log, _, _ = open_log(tmp_path)
    log.append([b"a" * 10])
    (big,) = log.append([b"b" * (SEG * 2)])
    assert big[0] in log.segment_bases()
    assert log.read(*big) == b"b" * (SEG * 2)
    (after,) = log.append([b"c"])
    assert after[0] in log.segment_bases()
    log.close()


def test_torn_tail_is_cut_at_every_offset(tmp_path: Path) -> None:
    log, _, _ = open_log(tmp_path)
    log.append(payloads(3))
    last_start = 216
    log.close()
    path = tmp_path / segment_name(0)
    full = path.read_bytes()
    for cut in range(last_start + 1, len(full)):
        path.write_bytes(full[:cut])
        log, seen, truncated = open_log(tmp_path)
        assert (len(seen), truncated, log.end) == (2, cut - last_start, last_start)
        log.close()


def test_crc_corruption_cuts_there_and_drops_later_segments(tmp_path: Path) -> None:
    log, _, _ = open_log(tmp_path)
    positions = [log.append([p])[0] for p in payloads(60, 400)]
    bases = log.segment_bases()
    total = log.end
    log.close()
    victim = positions[12][0]
    seg_base = max(b for b in bases if b <= victim)
    path = tmp_path / segment_name(seg_base)
    data = bytearray(path.read_bytes())
    data[victim - seg_base + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    log, seen, truncated = open_log(tmp_path)
    assert len(seen) == 12
    assert log.end == victim
    assert truncated == total - victim
    assert [b for b in log.segment_bases()] == [b for b in bases if b <= victim]
    assert log.append([b"next"])[0][0] == victim, "appends continue at the cut"
    log.close()


def test_read_verifies_crc(tmp_path: Path) -> None:
    log, _, _ = open_log(tmp_path)
    (pos,) = log.append([b"x" * 50])
    fd = os.open(tmp_path / segment_name(0), os.O_RDWR)
    os.pwrite(fd, b"y", 30)
    os.close(fd)
    with pytest.raises(StoreUnavailable, match="corrupt"):
        log.read(*pos)
    with pytest.raises(StoreUnavailable, match="outside"):
        log.read(10_000, 58)
    log.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=1, max_size=300))
def test_garbage_tail_never_breaks_open(tmp_path_factory: pytest.TempPathFactory, garbage: bytes) -> None:
    path = tmp_path_factory.mktemp("log")
    log, _, _ = open_log(path)
    log.append(payloads(2, 20))
    log.close()
    with open(path / segment_name(0), "ab") as f:
        f.write(garbage)
    log, seen, truncated = open_log(path)
    assert [p for _, _, p in seen[:2]] == payloads(2, 20)
    assert log.end + truncated == 56 + len(garbage)
    log.close()


def test_record_codec_round_trip() -> None:
    payload = encode_message(
        topic="T",
        queue_id=3,
        queue_offset=99,
        flag=-1,
        sys_flag=0x10,
        born_timestamp_ms=1,
        store_timestamp_ms=2,
        reconsume_times=4,
        born_host=("::1", 65535),
        lmqs=[("%LMQ%a", 7)],
        properties={"TAGS": "x", "ü": "\x01\x02"},
        body=b"\x00body",
    )
    record = decode_message(payload)
    assert (record.topic, record.queue_id, record.queue_offset, record.flag) == ("T", 3, 99, -1)
    assert record.born_host == ("::1", 65535)
    assert record.lmqs == (("%LMQ%a", 7),)
    assert record.properties == {"TAGS": "x", "ü": "\x01\x02"}
    assert record.body == b"\x00body"
    with pytest.raises(StoreUnavailable):
        decode_message(payload[:-1])
    with pytest.raises(StoreUnavailable):
        decode_message(payload + b"!")


@given(st.binary(max_size=200))
def test_record_decoder_only_raises_store_unavailable(data: bytes) -> None:
    with contextlib.suppress(StoreUnavailable):
        decode_message(data)


def test_iter_records_verifies_every_frame(tmp_path: Path) -> None:
    log, _, _ = open_log(tmp_path)
    positions = log.append(payloads(4, 30))
    assert [(o, s) for o, s, _ in log.iter_records()] == positions
    fd = os.open(tmp_path / segment_name(0), os.O_RDWR)
    os.pwrite(fd, b"\xff", positions[1][0] + 12)  # payload byte of record 1
    with pytest.raises(StoreUnavailable, match="corrupt record"):
        list(log.iter_records())
    os.pwrite(fd, b"\x7f", positions[1][0])  # absurd length of record 1
    with pytest.raises(StoreUnavailable, match="frame header"):
        list(log.iter_records())
    os.close(fd)
    log.close()


def test_segment_records_walks_a_sealed_segment_in_small_chunks(tmp_path: Path) -> None:
    log, _ = CommitLog.open(tmp_path, 4096, 0)
    try:
        payloads = [bytes([i]) * (100 + 37 * i) for i in range(20)]
        positions = [log.append([p])[0][0] for p in payloads]
        first = log.segment_bases()[0]
        sealed = [(o, p) for o, p in zip(positions, payloads, strict=True) if o < log.segment_bases()[1]]
        assert list(log.segment_records(first, chunk=64)) == sealed
        assert list(log.segment_records(first)) == sealed
    finally:
        log.close()
