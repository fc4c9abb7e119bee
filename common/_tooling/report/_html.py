"""The interactive timeline: one self-contained HTML file (inline SVG and JavaScript, no network)
with each plan's live bytes over its compiled step, stacked by kind or with the activations by
module (a switch at the top), device memory and, where the compiler placed any, host memory; the
peak marked. Hovering shows the bytes of each kind at that point and the modules that hold the
most there; dragging zooms in, double-clicking zooms out. The table under each plot lists what is
live at the peak, by kind, module and name."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ..breakdown._figures import ACTIVATION_KINDS, MemoryBreakdown, Timeline
from ..accelerators._units import fmt_bytes
from ._plots import KIND_COLORS, KIND_GREYS, TIMELINE_BY, module_colors, series_label
from ..measurement._report import Report

#: The most points a plan's timeline keeps in the file (each kept point is the largest of the
#: points it stands for, so the peak is kept exactly).
MAX_POINTS = 2000
#: The modules the hover lists at a point, largest first.
TOP_MODULES = 6

_SCRIPT = r"""
(function () {
  const DATA = JSON.parse(document.getElementById("remat-data").textContent);
  const NS = document.querySelector("svg").namespaceURI;
  const W = 900, H = 300, L = 70, B = 30;
  const FIRST = ["parameter", "optimizer state", "gradient", "input batch"];
  const ACT = new Set(DATA.activation);
  let BY = DATA.by;
  const fmt = (b) => { const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
    while (Math.abs(b) >= 1024 && i < 4) { b /= 1024; i++; } return i ? b.toFixed(2) + " " + u[i] : b + " B"; };
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  function el(tag, attrs, parent) { const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }
  const color = (n) => (BY === "module" ? DATA.greys[n] : DATA.colors[n]) || DATA.mcolors[n] || DATA.colors[n] || "#ccc";
  function stack(t) {
    const kinds = t.kinds.map((k, i) => [k, color(k), t.bytes[i]]);
    if (BY !== "module" || !t.modules.length) return kinds;
    const mods = t.modules.map((m, i) => [m, DATA.mcolors[m] || "#ccc", t.module_bytes[i]]).reverse();
    return kinds.filter((s) => FIRST.includes(s[0])).concat(mods,
      kinds.filter((s) => !FIRST.includes(s[0]) && !ACT.has(s[0])));
  }
  function legend() {
    const box = document.getElementById("legend");
    const names = new Set();
    DATA.plans.forEach((p) => ["device", "host"].forEach((s) => { if (p[s]) stack(p[s]).forEach((x) => names.add(x[0])); }));
    box.innerHTML = "";
    [...names].forEach((n) => { const sw = document.createElement("span");
      sw.style.background = color(n); box.appendChild(sw);
      box.appendChild(document.createTextNode(n)); });
  }
  const views = [];
  DATA.plans.forEach((p, pi) => ["device", "host"].forEach((space) => {
    const t = p[space];
    if (!t) return;
    const svg = document.getElementById("plot-" + pi + "-" + space);
    const tip = document.getElementById("tip-" + pi + "-" + space);
    const ymax = Math.max(...DATA.plans.map((q) => q[space] ? q[space].max : 0)) || 1;
    let lo = 0, hi = t.x[t.x.length - 1] || 1;
    function draw() {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      const sx = (x) => L + (x - lo) / Math.max(hi - lo, 1e-9) * (W - L - 10);
      const sy = (y) => H - B - y / ymax * (H - B - 10);
      if (t.backward) el("rect", {x: sx(Math.max(t.backward[0], lo)), y: 10,
        width: Math.max(0, sx(Math.min(t.backward[1], hi)) - sx(Math.max(t.backward[0], lo))),
        height: H - B - 10, fill: "#000", "fill-opacity": 0.05}, svg);
      const base = t.x.map(() => 0);
      stack(t).forEach(([name, color, vals]) => {
        const top = base.map((b, i) => b + vals[i]);
        let d = "";
        t.x.forEach((x, i) => { d += (i ? "L" : "M") + sx(x).toFixed(1) + "," + sy(top[i]).toFixed(1); });
        for (let i = t.x.length - 1; i >= 0; i--) d += "L" + sx(t.x[i]).toFixed(1) + "," + sy(base[i]).toFixed(1);
        el("path", {d: d + "Z", fill: color, stroke: "none"}, svg);
        top.forEach((v, i) => { base[i] = v; });
      });
      el("line", {x1: L, x2: W - 10, y1: H - B, y2: H - B, stroke: "#444"}, svg);
      el("line", {x1: L, x2: L, y1: 10, y2: H - B, stroke: "#444"}, svg);
      for (let j = 0; j <= 4; j++) { const v = ymax * j / 4;
        const lab = el("text", {x: L - 4, y: sy(v) + 4, "text-anchor": "end", "font-size": 10}, svg);
        lab.textContent = fmt(Math.round(v)); }
      const px = sx(t.peak);
      el("line", {x1: px, x2: px, y1: 10, y2: H - B, stroke: "#000", "stroke-dasharray": "4 3"}, svg);
      const lab = el("text", {x: px + 4, y: 22, "font-size": 11}, svg);
      lab.textContent = "peak " + fmt(t.max) + " (compiled " + fmt(t.total) + ")";
      const cur = el("line", {x1: -9, x2: -9, y1: 10, y2: H - B, stroke: "#c00"}, svg);
      const sel = el("rect", {x: 0, y: 10, width: 0, height: H - B - 10, fill: "#36c", "fill-opacity": 0.15}, svg);
      let down = null;
      const xOf = (ev) => { const r = svg.getBoundingClientRect();
        return lo + ((ev.clientX - r.left) * W / r.width - L) / (W - L - 10) * (hi - lo); };
      svg.onmousemove = (ev) => {
        const x = xOf(ev); let i = 0;
        while (i < t.x.length - 1 && t.x[i + 1] <= x) i++;
        cur.setAttribute("x1", sx(t.x[i])); cur.setAttribute("x2", sx(t.x[i]));
        let total = 0, rows = "";
        t.kinds.forEach((k, ki) => { const b = t.bytes[ki][i]; total += b;
          if (b) rows = "<tr><td>" + esc(k) + "</td><td>" + fmt(b) + "</td></tr>" + rows; });
        const top = t.modules.map((m, mi) => [m, t.module_bytes[mi][i]]).filter((e) => e[1])
          .sort((a, b) => b[1] - a[1]).slice(0, DATA.top);
        const mods = top.map(([m, b]) => "<tr><td>" + esc(m) + "</td><td>" + fmt(b) + "</td></tr>").join("");
        const phase = t.backward && t.x[i] >= t.backward[0] && t.x[i] <= t.backward[1] ? "backward"
          : (t.backward && t.x[i] > t.backward[1] ? "optimizer" : "forward");
        tip.innerHTML = "<b>point " + t.x[i] + "</b> (" + phase + "): " + fmt(total) +
          "<div class=\"cols\"><table><tr><th>kind</th><th></th></tr>" + rows + "</table>" +
          (mods ? "<table><tr><th>activations of the modules that hold the most</th><th></th></tr>" + mods + "</table>" : "") +
          "</div>";
        if (down !== null) { const a = sx(Math.min(down, x)), b = sx(Math.max(down, x));
          sel.setAttribute("x", a); sel.setAttribute("width", b - a); }
      };
      svg.onmousedown = (ev) => { down = xOf(ev); };
      svg.onmouseup = (ev) => { const x = xOf(ev);
        if (down !== null && Math.abs(x - down) > (hi - lo) / 200) { lo = Math.max(0, Math.min(down, x)); hi = Math.max(down, x); }
        down = null; draw(); };
      svg.ondblclick = () => { lo = 0; hi = t.x[t.x.length - 1] || 1; draw(); };
    }
    views.push(draw);
    draw();
  }));
  const by = document.getElementById("by");
  by.value = BY;
  by.onchange = () => { BY = by.value; legend(); views.forEach((d) => d()); };
  legend();
})();
"""

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
svg { width: 100%; max-width: 900px; height: auto; border: 1px solid #ddd; cursor: crosshair; }
table { border-collapse: collapse; font-size: 12px; }
td, th { padding: 1px 8px; text-align: left; } td.b { text-align: right; }
.tip { font-size: 12px; min-height: 4em; }
.cols { display: flex; gap: 2em; align-items: flex-start; }
#legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }
"""


def _downsample(series: list[list[int]], limit: int) -> list[int]:
    """The points kept: every point, or the largest (by the sum of ``series``) of each run."""
    n = len(series[0]) if series else 0
    if n <= limit:
        return list(range(n))
    step = -(-n // limit)
    return [max(range(lo, min(n, lo + step)), key=lambda t: sum(col[t] for col in series))
            for lo in range(0, n, step)]


def _space(b: MemoryBreakdown, tl: Timeline, total: int) -> dict[str, Any]:
    xs = _downsample([list(c) for c in tl.bytes], MAX_POINTS)
    return {
        "x": xs, "kinds": list(tl.kinds), "bytes": [[c[t] for t in xs] for c in tl.bytes],
        "modules": [series_label(b, m) for m in tl.modules],
        "module_bytes": [[c[t] for t in xs] for c in tl.module_bytes],
        "backward": None if tl.backward is None else list(tl.backward),
        "peak": tl.peak, "max": tl.max_bytes, "total": total,
    }


def timeline_data(report: Report, by: str = "kind") -> dict[str, Any]:
    """What the HTML file embeds: per plan its device timeline and, where its program holds
    host memory, its host timeline (each at most :data:`MAX_POINTS` points, with the module
    series), and the peak rows."""
    plans: list[dict[str, Any]] = []
    for p in report.plans:
        b = p.breakdown
        if b is None or b.timeline is None:  # read from a JSON written without its timeline
            continue
        host = b.host_timeline
        plans.append({
            "name": p.name, "compiler": b.compiler, "total": b.peak,
            "accounting": b.accounting(),  # the compiler's peak below the rows': a line
            "device": _space(b, b.timeline, b.peak),
            "host": None if host is None else _space(b, host, sum(r.bytes for r in b.host_rows)),
            "rows": [r.to_json() for r in b.rows if r.bytes],
            "host_rows": [r.to_json() for r in b.host_rows],
        })
    mcolors = module_colors(m for p in plans for s in ("device", "host") if p[s]
                            for m in p[s]["modules"])
    return {"plans": plans, "colors": KIND_COLORS, "greys": KIND_GREYS,
            "activation": list(ACTIVATION_KINDS),
            "mcolors": mcolors, "by": by, "top": TOP_MODULES}


def _rows_table(rows: list[dict[str, Any]], title: str) -> list[str]:
    out = [f"<details><summary>{html.escape(title)}</summary><table>"
           "<tr><th>kind</th><th>module</th><th>name</th><th>bytes</th></tr>"]
    for r in rows:
        module = "&lt;root&gt;" if r["module"] == "" else html.escape(r["module"] or "-")
        out.append(f"<tr><td>{html.escape(r['kind'])}</td><td>{module}</td>"
                   f"<td>{html.escape(r['name'] or '')}</td>"
                   f"<td class=\"b\">{fmt_bytes(r['bytes'])}</td></tr>")
    out.append("</table></details>")
    return out


def write_html(report: Report, path: str | Path, by: str = "kind") -> Path:
    """Writes the interactive timeline of every plan of ``report`` to ``path`` (one file that
    opens from disk: no server, nothing fetched), stacked by ``by`` (``kind`` or ``module``;
    the page switches between them)."""
    if by not in TIMELINE_BY:
        raise ValueError(f"remat_common.measurement.write_html: by must be one of "
                         f"{list(TIMELINE_BY)}, got {by!r}. Fix: by='module' or by='kind'.")
    data = timeline_data(report, by)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    caps = report.capabilities
    options = "".join(f'<option value="{b}">{b}</option>' for b in TIMELINE_BY)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>remat report: live bytes over each plan's step</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Live bytes over each plan's compiled step</h1><p>measured with jax "
        f"{html.escape(caps.jax)} on {html.escape(caps.backend)}. Hover a plot for the bytes of "
        "each kind at that point of the schedule and the modules whose activations hold the "
        "most there; drag to zoom in, double-click to zoom out. The shaded span is the "
        "backward pass; the dashed line is the peak, whose contents are listed under each "
        "plot.</p>",
        f'<p><label>stack by <select id="by">{options}</select></label> (module: the '
        "activations by module at layer depth, the other kinds as they are)</p>",
        '<p id="legend"></p>',
    ]
    for i, p in enumerate(data["plans"]):
        parts.append(f"<h2>{html.escape(p['name'])} <small>(peak {fmt_bytes(p['total'])}, "
                     f"{html.escape(p['compiler'])} compiler)</small></h2>")
        for space in ("device", "host"):
            if p[space] is None:
                continue
            if space == "host":
                parts.append(f"<h3>host memory <small>(peak {fmt_bytes(p['host']['total'])})"
                             "</small></h3>")
            parts.append(f'<svg id="plot-{i}-{space}" viewBox="0 0 900 300" role="img" '
                         f'aria-label="live {space} bytes of plan {html.escape(p["name"])}"></svg>')
            parts.append(f'<div class="tip" id="tip-{i}-{space}"></div>')
        if p["accounting"]:
            parts.append(f"<p>{html.escape(p['accounting'])}</p>")
        parts += _rows_table(p["rows"], "at the peak, by kind, module and name")
        if p["host_rows"]:
            parts += _rows_table(p["host_rows"], "at the host peak, by kind, module and name")
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    parts.append(f'<script type="application/json" id="remat-data">{blob}</script>')
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    out.write_text("\n".join(parts) + "\n")
    return out

