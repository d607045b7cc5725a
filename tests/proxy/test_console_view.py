"""The console's sans-IO rendering: every client-supplied text is escaped in the page (element content and
attributes) and JSON-encoded for the event stream; the page and the stream carry the same texts; the
rejection ring is bounded."""

from __future__ import annotations

from html.parser import HTMLParser

import orjson
import pytest

from mqproxy.console import SYSTEM_NAMES
from mqproxy.console_assets import SCRIPT
from mqproxy.console_view import (
    ConnRow,
    ConsoleSnapshot,
    LagRow,
    LagSection,
    RejectionRow,
    TopicSection,
    live_texts,
    render_page,
    snapshot_json,
    table_texts,
)
from mqproxy.mqtt.mapping import SESSION_STATE_TOPIC
from mqproxy.rejections import MAX_TEXT, RejectionRing

INJECTIONS = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "'><svg onload=alert(1)>",
    "</td></tr></tbody></table><script>alert(2)</script>",
    "&lt;already&gt; & \u2028\u2029 \n line",
]


def _snapshot(text: str) -> ConsoleSnapshot:
    return ConsoleSnapshot(
        taken_unix_s=1_800_000_000.0,
        uptime_s=12.3,
        backend="memory",
        open_connections=1,
        connections_total=4,
        by_protocol=(("mqtt", 1),),
        connections=(ConnRow("c1", "mqtt", text, "127.0.0.1:5000", 3.0, 120, 4),),
        topics=TopicSection(topics=1, lmqs=2, names=(text,)),
        lag=LagSection(
            updated_unix_s=1_800_000_000.0,
            groups=((text, 7),),
            rows=(LagRow(text, text, 4, 7),),
            rows_total=1,
        ),
        connector_note="runs elsewhere",
        rejections=(RejectionRow(1_800_000_000.0, "auth.denied", "mqtt", "127.0.0.1:1", text, text, text),),
    )


class _Page(HTMLParser):
    """Collects the tags and the text of each table cell."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "td":
            self._in_cell = True
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells[-1] += data


def _parse(page: str) -> _Page:
    parser = _Page()
    parser.convert_charrefs = True
    parser.feed(page)
    parser.close()
    return parser


@pytest.mark.parametrize("text", INJECTIONS)
def test_client_text_renders_as_text_never_markup(text: str) -> None:
    page = render_page(
        _snapshot(text), events_path="/console/events", script_path="/s.js", style_path="/s.css"
    )
    parsed = _parse(page)
    tags = [tag for tag, _ in parsed.tags]
    assert tags.count("script") == 1  # the console's own, nothing injected
    assert "img" not in tags
    assert "svg" not in tags
    assert all(not name.startswith("on") for _, attrs in parsed.tags for name in attrs)
    assert parsed.tags[-1] == ("script", {"src": "/s.js", "defer": None})
    assert "<script>alert" not in page
    # every place the text was shown holds it whole, as text: client id, topic, group, lag row, rejection
    assert parsed.cells.count(text) >= 8


@pytest.mark.parametrize("text", INJECTIONS)
def test_event_json_is_one_line_and_carries_the_text_unchanged(text: str) -> None:
    payload = snapshot_json(_snapshot(text))
    assert b"\n" not in payload
    assert b"\r" not in payload
    data = orjson.loads(payload)
    assert data["tables"]["connections"][0][1] == text
    assert data["tables"]["topic_names"] == [[text]]
    assert data["tables"]["rejections"][0][3:] == [text, text, text]
    assert data["snapshot"]["connections"][0]["client_id"] == text


def test_page_and_stream_show_the_same_texts() -> None:
    snapshot = _snapshot("client-1")
    parsed = _parse(render_page(snapshot, events_path="/e", script_path="/s", style_path="/c"))
    live_names = {attrs["data-live"] for _, attrs in parsed.tags if "data-live" in attrs}
    assert live_names == set(live_texts(snapshot))
    body_ids = [attrs["id"] for tag, attrs in parsed.tags if tag == "tbody"]
    tables = table_texts(snapshot)
    assert body_ids == list(tables)
    assert parsed.cells == [cell for rows in tables.values() for row in rows for cell in row]
    assert live_texts(snapshot)["by_protocol"] == "mqtt 1"
    assert tables["connections"] == [["mqtt", "client-1", "127.0.0.1:5000", "3 s", "120", "4"]]


def test_empty_cells_and_missing_readings() -> None:
    snapshot = ConsoleSnapshot(
        0.0, 0.0, "memory", 0, 0, connections=(ConnRow("c", "http", None, "x", 0, 0, 0),)
    )
    assert table_texts(snapshot)["connections"][0][1] == ""
    assert live_texts(snapshot)["lag_updated"] == "none yet"
    assert live_texts(snapshot)["by_protocol"] == "none"


def test_script_writes_text_only() -> None:
    assert "innerHTML" not in SCRIPT
    assert "outerHTML" not in SCRIPT
    assert "insertAdjacentHTML" not in SCRIPT
    assert "eval(" not in SCRIPT
    assert "document.write" not in SCRIPT
    assert "textContent" in SCRIPT


def test_rejection_ring_is_bounded_newest_first_and_clips_text() -> None:
    ring = RejectionRing(size=3)
    for i in range(5):
        ring.add(float(i), "conn.rejected", protocol=None, peer=f"p{i}", reason="sniff_timeout")
    ring.add(9.0, "auth.denied", protocol="mqtt", peer="p", reason="x" * 5000, access_key="k" * 5000)
    rows = ring.rows()
    assert [r.peer for r in rows] == ["p", "p4", "p3"]
    assert ring.total == 6
    assert len(rows[0].reason) == MAX_TEXT
    assert rows[0].reason.endswith("…")
    assert rows[0].access_key is not None
    assert len(rows[0].access_key) == MAX_TEXT


def test_system_topic_names_match_their_owners() -> None:
    assert SESSION_STATE_TOPIC in SYSTEM_NAMES
