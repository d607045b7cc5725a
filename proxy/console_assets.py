"""
mqproxy.console_assets
~~~~~~~~~~~~~~~~~~~~~~

The console page's script and style, served as ``/console/console.js`` and ``/console/console.css`` (own
files, so the page's Content-Security-Policy can forbid inline script).

The script follows the page's ``data-events`` URL with ``EventSource`` and, per ``snapshot`` message, copies
``live`` texts into the ``data-live`` elements and rebuilds each table body from ``tables`` (see
:func:`mqproxy.console_view.snapshot_json`). It writes with ``textContent`` only, never ``innerHTML``.
"""

from __future__ import annotations

__all__ = ["SCRIPT", "STYLE"]

SCRIPT = """\
"use strict";
(function () {
  var status = document.getElementById("status");
  var updates = 0;
  function fill(id, rows) {
    var old = document.getElementById(id);
    if (!old) { return; }
    var body = document.createElement("tbody");
    body.id = id;
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      row.forEach(function (cell) {
        var td = document.createElement("td");
        td.textContent = cell;
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    old.replaceWith(body);
  }
  var source = new EventSource(document.body.dataset.events);
  source.addEventListener("snapshot", function (event) {
    var data = JSON.parse(event.data);
    Object.keys(data.live).forEach(function (name) {
      document.querySelectorAll("[data-live]").forEach(function (el) {
        if (el.dataset.live === name) { el.textContent = data.live[name]; }
      });
    });
    Object.keys(data.tables).forEach(function (id) { fill(id, data.tables[id]); });
    updates += 1;
    status.textContent = "live (" + updates + " updates)";
  });
  source.addEventListener("error", function () { status.textContent = "reconnecting"; });
})();
"""

STYLE = """\
body { font: 14px/1.4 system-ui, sans-serif; margin: 1rem 2rem; color: #1b1f24; background: #fafbfc; }
main { display: grid; grid-template-columns: repeat(auto-fit, minmax(34rem, 1fr)); gap: 0 2.5rem; }
section.wide { grid-column: 1 / -1; }
h1 { font-size: 1.4rem; margin: 0 0 .2rem; }
h2 { font-size: 1.1rem; margin: 1.2rem 0 .3rem; border-bottom: 1px solid #d0d7de; }
header p, section p { margin: .2rem 0 .4rem; color: #57606a; }
table { border-collapse: collapse; margin: .3rem 0 .6rem; min-width: 24rem; }
th, td { border: 1px solid #d0d7de; padding: .15rem .5rem; text-align: left; }
td { font-variant-numeric: tabular-nums; }
th { background: #eaeef2; }
td { max-width: 40rem; overflow-wrap: anywhere; }
#status { font-weight: 600; color: #1a7f37; }
"""
