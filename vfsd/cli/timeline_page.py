"""The page `vfsd timeline --html` writes: one file, inline CSS, SVG and JS, no network.

The timeline document is embedded as JSON and drawn by the script: a chart
of live bytes, stored bytes and files over the steps (snapshots and
restores marked), and a table with one row per step whose details list the
files made, changed, deleted and evicted and the tool calls behind them.
Everything from the run (paths, labels, tool names) reaches the page as
text nodes, never as markup.
"""

from __future__ import annotations

import html
import json

_STYLE = """
body { font: 14px/1.4 "DejaVu Sans", sans-serif; margin: 24px; color: #1d2733; }
h1 { font-size: 20px; margin: 0 0 4px; }
.meta { color: #5b6b7c; margin: 0 0 16px; }
#chart svg { background: #fbfcfd; border: 1px solid #dde3ea; }
.axis text, .mark text { font-size: 11px; fill: #5b6b7c; }
.axis line, .grid line { stroke: #dde3ea; }
.live { stroke: #2b6cb0; fill: none; stroke-width: 2; }
.stored { stroke: #2b6cb0; fill: none; stroke-width: 1.5; stroke-dasharray: 5 4; }
.files { stroke: #c05621; fill: none; stroke-width: 2; }
circle.live { fill: #2b6cb0; } circle.files { fill: #c05621; }
.mark line { stroke: #38a169; stroke-dasharray: 2 3; }
.mark.restore line { stroke: #805ad5; }
.legend span { margin-right: 18px; } .legend i { display: inline-block; width: 18px;
  height: 3px; vertical-align: middle; margin-right: 6px; }
table { border-collapse: collapse; margin-top: 18px; width: 100%; }
th, td { text-align: right; padding: 4px 8px; border-bottom: 1px solid #e6ebf0; white-space: nowrap; }
td:last-child { white-space: normal; }
th:last-child, td:last-child { text-align: left; }
tr.step:hover { background: #f3f7fb; }
details summary { cursor: pointer; }
.paths { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; color: #37475a; }
"""

_SCRIPT = r"""
(function () {
  const doc = JSON.parse(document.getElementById("timeline-data").textContent);
  const steps = doc.steps;
  const NS = "http://www.w3.org/2000/svg";
  const W = 960, H = 320, L = 70, R = 60, T = 20, B = 40;
  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function human(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
  }
  function text(parent, tag, value, cls) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    e.textContent = value;
    parent.appendChild(e);
    return e;
  }
  const svg = el("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H,
                         id: "timeline-chart"}, document.getElementById("chart"));
  const pts = steps;
  const n = steps.length;
  const maxB = Math.max(1, ...pts.map(s => Math.max(s.logical_bytes, s.stored_bytes)));
  const maxF = Math.max(1, ...pts.map(s => s.files));
  // One slot per record, in the order things happened: a restore takes the
  // step back, and the axis says so.
  const X = i => L + (n > 1 ? i / (n - 1) : 0.5) * (W - L - R);
  const YB = v => H - B - v / maxB * (H - T - B);
  const YF = v => H - B - v / maxF * (H - T - B);
  const axis = el("g", {class: "axis"}, svg);
  el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B}, axis);
  for (let i = 0; i <= 4; i++) {
    const y = H - B - i / 4 * (H - T - B);
    el("line", {x1: L, y1: y, x2: W - R, y2: y, class: "grid"}, axis);
    el("text", {x: L - 6, y: y + 4, "text-anchor": "end"}, axis).textContent = human(maxB * i / 4);
    el("text", {x: W - R + 6, y: y + 4}, axis).textContent = Math.round(maxF * i / 4);
  }
  const every = Math.max(1, Math.ceil(n / 30));
  steps.forEach((s, i) => {
    if (i % every === 0 || i === n - 1)
      el("text", {x: X(i), y: H - B + 16, "text-anchor": "middle"}, axis).textContent = s.step;
  });
  el("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle"}, axis).textContent = "step";
  steps.forEach((s, i) => {
    for (const snap of s.snapshots) {
      const g = el("g", {class: "mark snapshot", "data-snapshot": snap.id}, svg);
      el("line", {x1: X(i), y1: T, x2: X(i), y2: H - B}, g);
      el("text", {x: X(i) + 3, y: T + 10}, g).textContent = snap.id;
    }
    for (const r of s.restores) {
      const g = el("g", {class: "mark restore", "data-restore": r.id}, svg);
      el("line", {x1: X(i), y1: T, x2: X(i), y2: H - B}, g);
      el("text", {x: X(i) + 3, y: T + 22}, g).textContent = "restore " + r.id;
    }
  });
  function series(cls, y, key) {
    if (!n) return;
    const d = pts.map((s, i) => (i ? "L" : "M") + X(i).toFixed(1) + " " +
                                y(s[key]).toFixed(1)).join(" ");
    el("path", {d: d, class: cls + " series", "data-series": key}, svg);
    if (cls === "stored") return;
    pts.forEach((s, i) => {
      const c = el("circle", {cx: X(i), cy: y(s[key]), r: 3, class: cls,
                              "data-step": s.step, "data-seq": s.seq, "data-series": key}, svg);
      el("title", {}, c).textContent = "step " + s.step + ": " +
          (key === "files" ? s.files + " files" : human(s[key]));
    });
  }
  series("stored", YB, "stored_bytes");
  series("live", YB, "logical_bytes");
  series("files", YF, "files");

  const body = document.querySelector("#steps tbody");
  for (const s of [...steps].reverse()) {
    const tr = document.createElement("tr");
    tr.className = "step";
    tr.dataset.step = s.step;
    tr.dataset.seq = s.seq;
    const dash = v => (v === null || v === undefined) ? "-" : v;
    const cells = [s.step, dash(s.files), human(s.logical_bytes), human(s.stored_bytes),
                   s.created, s.changed, s.deleted, s.evicted];
    for (const v of cells) text(tr, "td", String(v));
    const last = document.createElement("td");
    const det = document.createElement("details");
    const notes = [];
    for (const snap of s.snapshots) notes.push(snap.id + (snap.label ? " (" + snap.label + ")" : ""));
    for (const r of s.restores) notes.push("restored " + r.id + " (from step " + r.from_step + ")");
    for (const c of s.calls) {
      const who = c.call === null ? "no tool call" :
          (c.call.tool ? c.call.tool + " " + c.call.id : (c.call.unknown ? "unknown" : c.call.key));
      const parts = [];
      if (c.created) parts.push(c.created + " made");
      if (c.changed) parts.push(c.changed + " changed");
      if (c.deleted) parts.push(c.deleted + " deleted");
      notes.push(who + (parts.length ? " (" + parts.join(", ") + ")" : ""));
    }
    text(det, "summary", notes.join("; ") || "no changes");
    for (const [label, key] of [["made", "created_paths"], ["changed", "changed_paths"],
                                ["deleted", "deleted_paths"], ["evicted", "evicted_paths"]]) {
      if (!s[key] || !s[key].length) continue;
      const p = text(det, "div", label + ": ", "paths");
      p.dataset.kind = key;
      p.appendChild(document.createTextNode(s[key].join(", ")));
    }
    last.appendChild(det);
    tr.appendChild(last);
    body.appendChild(tr);
  }
  document.body.dataset.rendered = steps.length;
})();
"""


def render(doc: dict, *, title: str) -> str:
    """The whole page for a timeline document."""
    # Inside <script>, `</script` and `<!--` would change how the HTML parser
    # reads on: JSON's own escapes keep every `<`, `>` and `&` out of the
    # text, and the data stays valid JSON (`<\\!--` was not: a file named
    # `<!--x` blanked the page).
    data = (json.dumps(doc).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))
    steps = len(doc["steps"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>vfsd timeline: {html.escape(title)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>Run timeline: {html.escape(title)}</h1>
<p class="meta">run {html.escape(str(doc.get("run")))} &middot; step {doc.get("step")} &middot;
{doc.get("files")} files &middot; {steps} records (one per step, and one more each
time a restore took the run back to an earlier step)</p>
<div class="legend"><span><i style="background:#2b6cb0"></i>bytes live</span>
<span><i style="background:repeating-linear-gradient(90deg,#2b6cb0 0 5px,transparent 5px 9px)"></i>bytes stored</span>
<span><i style="background:#c05621"></i>files (right axis)</span>
<span><i style="background:#38a169"></i>snapshot</span><span><i style="background:#805ad5"></i>restore</span></div>
<div id="chart"></div>
<table id="steps"><thead><tr><th>step</th><th>files</th><th>live</th><th>stored</th>
<th>made</th><th>changed</th><th>deleted</th><th>evicted</th><th>snapshots, restores, tool calls</th>
</tr></thead><tbody></tbody></table>
<script type="application/json" id="timeline-data">{data}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
