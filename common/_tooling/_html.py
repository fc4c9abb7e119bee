"""The interactive timeline: one self-contained HTML file (inline SVG and JavaScript, no network)
with each plan's live bytes over its compiled step, stacked by kind, the peak marked; hovering
shows each kind's bytes at that point, dragging zooms in, double-clicking zooms out; the table
under each plot lists what is live at the peak, by kind, module and name."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ._breakdown import KINDS
from ._profiles import fmt_bytes
from ._report import Report

#: The most points a plan's timeline keeps in the file (each kept point is the largest of the
#: points it stands for, so the peak is kept exactly).
MAX_POINTS = 2000

_COLORS = {
    "parameter": "#4c72b0", "optimizer state": "#8172b3", "gradient": "#64b5cd",
    "input batch": "#937860", "saved residual": "#c44e52", "offloaded residual": "#dd8452",
    "temporary (forward)": "#55a868", "temporary (backward)": "#8de5a1",
    "temporary (optimizer)": "#b0b0b0", "output": "#da8bc3", "unwritten output": "#e4e4e4",
    "allocator slack": "#f6f6f6", "other argument": "#999999",
}

_SCRIPT = r"""
(function () {
  const DATA = JSON.parse(document.getElementById("remat-data").textContent);
  const NS = document.querySelector("svg").namespaceURI;
  const W = 900, H = 300, L = 70, B = 30;
  const fmt = (b) => { const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
    while (Math.abs(b) >= 1024 && i < 4) { b /= 1024; i++; } return i ? b.toFixed(2) + " " + u[i] : b + " B"; };
  const ymax = Math.max(...DATA.plans.map(p => p.max)) || 1;
  function el(tag, attrs, parent) { const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }
  DATA.plans.forEach((p, pi) => {
    const svg = document.getElementById("plot-" + pi);
    const tip = document.getElementById("tip-" + pi);
    let lo = 0, hi = p.x[p.x.length - 1] || 1;
    function draw() {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      const sx = (x) => L + (x - lo) / Math.max(hi - lo, 1e-9) * (W - L - 10);
      const sy = (y) => H - B - y / ymax * (H - B - 10);
      if (p.backward) el("rect", {x: sx(Math.max(p.backward[0], lo)), y: 10,
        width: Math.max(0, sx(Math.min(p.backward[1], hi)) - sx(Math.max(p.backward[0], lo))),
        height: H - B - 10, fill: "#000", "fill-opacity": 0.05}, svg);
      const base = p.x.map(() => 0);
      p.kinds.forEach((k, ki) => {
        const top = base.map((b, i) => b + p.bytes[ki][i]);
        let d = "";
        p.x.forEach((x, i) => { d += (i ? "L" : "M") + sx(x).toFixed(1) + "," + sy(top[i]).toFixed(1); });
        for (let i = p.x.length - 1; i >= 0; i--) d += "L" + sx(p.x[i]).toFixed(1) + "," + sy(base[i]).toFixed(1);
        el("path", {d: d + "Z", fill: DATA.colors[k] || "#ccc", stroke: "none"}, svg);
        top.forEach((t, i) => { base[i] = t; });
      });
      el("line", {x1: L, x2: W - 10, y1: H - B, y2: H - B, stroke: "#444"}, svg);
      el("line", {x1: L, x2: L, y1: 10, y2: H - B, stroke: "#444"}, svg);
      for (let j = 0; j <= 4; j++) { const v = ymax * j / 4;
        const t = el("text", {x: L - 4, y: sy(v) + 4, "text-anchor": "end", "font-size": 10}, svg);
        t.textContent = fmt(Math.round(v)); }
      const px = sx(p.peak);
      el("line", {x1: px, x2: px, y1: 10, y2: H - B, stroke: "#000", "stroke-dasharray": "4 3"}, svg);
      const lab = el("text", {x: px + 4, y: 22, "font-size": 11}, svg);
      lab.textContent = "peak " + fmt(p.max) + " (compiled " + fmt(p.total) + ")";
      const cur = el("line", {x1: -9, x2: -9, y1: 10, y2: H - B, stroke: "#c00"}, svg);
      const sel = el("rect", {x: 0, y: 10, width: 0, height: H - B - 10, fill: "#36c", "fill-opacity": 0.15}, svg);
      let down = null;
      const xOf = (ev) => { const r = svg.getBoundingClientRect();
        return lo + ((ev.clientX - r.left) * W / r.width - L) / (W - L - 10) * (hi - lo); };
      svg.onmousemove = (ev) => {
        const x = xOf(ev); let i = 0;
        while (i < p.x.length - 1 && p.x[i + 1] <= x) i++;
        cur.setAttribute("x1", sx(p.x[i])); cur.setAttribute("x2", sx(p.x[i]));
        let total = 0, rows = "";
        p.kinds.forEach((k, ki) => { const b = p.bytes[ki][i]; total += b;
          if (b) rows = "<tr><td>" + k + "</td><td>" + fmt(b) + "</td></tr>" + rows; });
        tip.innerHTML = "<b>point " + p.x[i] + "</b> (" + (p.backward && p.x[i] >= p.backward[0] && p.x[i] <= p.backward[1] ? "backward" : (p.backward && p.x[i] > p.backward[1] ? "optimizer" : "forward")) +
          "): " + fmt(total) + "<table>" + rows + "</table>";
        if (down !== null) { const a = sx(Math.min(down, x)), b = sx(Math.max(down, x));
          sel.setAttribute("x", a); sel.setAttribute("width", b - a); }
      };
      svg.onmousedown = (ev) => { down = xOf(ev); };
      svg.onmouseup = (ev) => { const x = xOf(ev);
        if (down !== null && Math.abs(x - down) > (hi - lo) / 200) { lo = Math.max(0, Math.min(down, x)); hi = Math.max(down, x); }
        down = null; draw(); };
      svg.ondblclick = () => { lo = 0; hi = p.x[p.x.length - 1] || 1; draw(); };
    }
    draw();
  });
})();
"""

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
svg { width: 100%; max-width: 900px; height: auto; border: 1px solid #ddd; cursor: crosshair; }
table { border-collapse: collapse; font-size: 12px; }
td, th { padding: 1px 8px; text-align: left; } td.b { text-align: right; }
.tip { font-size: 12px; min-height: 4em; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }
"""


def _downsample(bytes_: list[list[int]], limit: int) -> tuple[list[int], list[list[int]]]:
    n = len(bytes_[0]) if bytes_ else 0
    if n <= limit:
        return list(range(n)), bytes_
    step = -(-n // limit)
    xs: list[int] = []
    for lo in range(0, n, step):
        span = range(lo, min(n, lo + step))
        xs.append(max(span, key=lambda t: sum(col[t] for col in bytes_)))
    return xs, [[col[t] for t in xs] for col in bytes_]


def timeline_data(report: Report) -> dict[str, Any]:
    """What the HTML file embeds: per plan its timeline (at most :data:`MAX_POINTS` points) and
    its peak rows."""
    plans = []
    for p in report.plans:
        b = p.breakdown
        if b is None:
            continue
        tl = b.timeline
        xs, cols = _downsample([list(c) for c in tl.bytes], MAX_POINTS)
        plans.append({
            "name": p.name, "kinds": list(tl.kinds), "x": xs, "bytes": cols,
            "backward": None if tl.backward is None else list(tl.backward),
            "peak": tl.peak, "max": tl.max_bytes, "total": b.total, "compiler": b.compiler,
            "rows": [r.to_json() for r in b.rows],
        })
    return {"plans": plans, "colors": _COLORS}


def write_html(report: Report, path: str | Path) -> Path:
    """Writes the interactive timeline of every plan of ``report`` to ``path`` (one file that
    opens from disk: no server, nothing fetched)."""
    data = timeline_data(report)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    caps = report.capabilities
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>remat report: live bytes over each plan's step</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Live bytes over each plan's compiled step</h1><p>measured with jax "
        f"{html.escape(caps.jax)} on {html.escape(caps.backend)}. Hover a plot for the bytes of "
        "each kind at that point of the schedule; drag to zoom in, double-click to zoom out. "
        "The shaded span is the backward pass; the dashed line is the peak, whose contents are "
        "listed under each plot.</p>",
        '<p class="legend">' + "".join(
            f'<span style="background:{_COLORS[k]}"></span>{html.escape(k)}' for k in KINDS
            if any(k in p["kinds"] for p in data["plans"])) + "</p>",
    ]
    for i, p in enumerate(data["plans"]):
        parts.append(f"<h2>{html.escape(p['name'])} <small>(peak {fmt_bytes(p['total'])}, "
                     f"{html.escape(p['compiler'])} compiler)</small></h2>")
        parts.append(f'<svg id="plot-{i}" viewBox="0 0 900 300" role="img" '
                     f'aria-label="live bytes of plan {html.escape(p["name"])}"></svg>')
        parts.append(f'<div class="tip" id="tip-{i}"></div>')
        parts.append("<details><summary>at the peak, by kind, module and name</summary><table>"
                     "<tr><th>kind</th><th>module</th><th>name</th><th>bytes</th></tr>")
        for r in p["rows"]:
            module = "&lt;root&gt;" if r["module"] == "" else html.escape(r["module"] or "-")
            parts.append(f"<tr><td>{html.escape(r['kind'])}</td><td>{module}</td>"
                         f"<td>{html.escape(r['name'] or '')}</td>"
                         f"<td class=\"b\">{fmt_bytes(r['bytes'])}</td></tr>")
        parts.append("</table></details>")
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    parts.append(f'<script type="application/json" id="remat-data">{blob}</script>')
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    out.write_text("\n".join(parts) + "\n")
    return out
