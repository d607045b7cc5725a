"""Index.first_offset remembers a queue's first offset; every change of the rows below it is seen."""

from __future__ import annotations

from pathlib import Path

from mqproxy.backends.embedded.cq_entry import QID, pack_row
from mqproxy.backends.embedded.index import Index, queue_key


def _append(index: Index, qid: int, offsets: range, clo: int = 0, new: bool = False) -> None:
    rows = [(QID.pack(qid), pack_row(o, clo + 100 * o, 100, 0, 1000 + o)) for o in offsets]
    queues = [(queue_key("t", qid), qid)] if new else []
    index.commit(rows, queues, qid + 1, clo + 100 * offsets.stop, 1000 + offsets.stop)


def test_an_append_keeps_the_remembered_first_offset_and_reads_no_page(tmp_path: Path) -> None:
    index = Index(tmp_path / "index")
    try:
        assert index.first_offset(1) is None
        _append(index, 1, range(0, 4), new=True)
        assert index.first_offset(1) == 0
        _append(index, 1, range(4, 8))
        env, index._env = index._env, None  # type: ignore[assignment]  # a read would fail now
        try:
            assert index.first_offset(1) == 0
        finally:
            index._env = env
    finally:
        index.close()


def test_deleting_and_rewriting_rows_moves_the_first_offset(tmp_path: Path) -> None:
    index = Index(tmp_path / "index")
    try:
        _append(index, 1, range(0, 10), new=True)
        assert index.first_offset(1) == 0
        index.drop_below(300, [1], 100)  # the rows whose record lies below commit-log offset 300
        assert index.first_offset(1) == 3
        assert index.rewrite(1, [5], 8, 2000) == (8, 11)
        assert index.first_offset(1) == 8
        index.delete_queues([(queue_key("t", 1), 1)])
        assert index.first_offset(1) is None
        _append(index, 1, range(0, 2), clo=5000, new=True)
        assert index.first_offset(1) == 0
        index.reset_queues()
        assert index.first_offset(1) is None
    finally:
        index.close()


def test_an_append_that_replaces_rows_forgets_first_offsets(tmp_path: Path) -> None:
    index = Index(tmp_path / "index")
    try:
        _append(index, 1, range(3, 6), new=True)
        assert index.first_offset(1) == 3
        _append(index, 1, range(1, 4))  # below the queue's last row: upserted, a lower first offset
        assert index.first_offset(1) == 1
    finally:
        index.close()
