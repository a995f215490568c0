"""The self-contained HTML page of ``speculant graph-viz``: inline CSS and JavaScript, no network.

The chosen nodes and edges are embedded as JSON in a ``<script type="application/json">``
element (``<``, ``>`` and ``&`` written as ``\\u003c`` etc., so token text cannot close the
element); the page's script parses it and builds the SVG with ``createElementNS`` and
``textContent`` only, never ``innerHTML``. A Content-Security-Policy allows nothing but the
page's own script and style (by hash): no request leaves the page.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from typing import Any

from builder.graph_viz import VizGraph

STYLE = """
:root { --bg: #fbfbfa; --fg: #222; --muted: #666; --edge: #8a8f98; }
* { box-sizing: border-box; }
html, body { margin: 0; height: 100%; background: var(--bg); color: var(--fg);
  font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
#app { display: flex; flex-direction: column; height: 100%; }
header { padding: 8px 14px; border-bottom: 1px solid #ddd; display: flex; gap: 18px;
  align-items: baseline; flex-wrap: wrap; }
header h1 { font-size: 15px; margin: 0; }
header .meta { color: var(--muted); }
header code { background: #eee; padding: 1px 4px; border-radius: 3px; white-space: pre; }
#legend { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; color: var(--muted); }
#legend .sw { display: inline-block; width: 11px; height: 11px; border-radius: 50%;
  margin-right: 4px; vertical-align: -1px; border: 1px solid rgba(0,0,0,.35); }
#legend button { font: inherit; padding: 1px 8px; }
#canvas { flex: 1; position: relative; overflow: hidden; }
svg { width: 100%; height: 100%; display: block; cursor: grab; user-select: none; }
svg.panning { cursor: grabbing; }
.edge { fill: none; stroke: var(--edge); stroke-opacity: .55; }
.edge.then { stroke-dasharray: 3 3; stroke-opacity: .45; }
.edge:hover, .edge.hl { stroke-opacity: .95; }
.node { cursor: pointer; }
.node circle { stroke: #333; stroke-width: 1; }
.node.token circle { fill: #fff; }
.node.root circle { stroke-width: 3; }
.node text { font-size: 13px; fill: #222; paint-order: stroke; stroke: var(--bg);
  stroke-width: 3px; stroke-linejoin: round; pointer-events: none; }
.dim { opacity: .15; }
#tip { position: absolute; pointer-events: none; background: #fff; border: 1px solid #bbb;
  border-radius: 4px; padding: 6px 8px; box-shadow: 0 2px 6px rgba(0,0,0,.15);
  max-width: 420px; display: none; white-space: pre-wrap; word-break: break-word; }
#tip .t { font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var ORDER_COLOURS = ["#4e79a7", "#59a14f", "#edc948", "#f28e2b", "#e15759",
                       "#b07aa1", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac"];
  var data = JSON.parse(document.getElementById("graph-data").textContent);
  var nodes = data.nodes, edges = data.edges;
  var byId = {};
  nodes.forEach(function (n) { byId[n.id] = n; n.out = []; n.inc = []; });
  edges.forEach(function (e) { byId[e.source].out.push(e); byId[e.target].inc.push(e); });

  function el(name, attrs, parent) {
    var x = document.createElementNS(NS, name);
    for (var k in attrs) { x.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(x); }
    return x;
  }
  function colour(n) { return n.kind === "token" ? "#ffffff" : ORDER_COLOURS[(n.order - 1) % 10]; }
  function visible(s) { return s.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5"); }
  function shortLabel(n) {
    var s = visible(n.text).trim();
    if (s === "") { s = JSON.stringify(n.text); }
    return s.length > 22 ? "\u2026" + s.slice(s.length - 21) : s;
  }

  // Layered layout: one column per step; rows ordered by the mean row of the parents.
  var layers = [];
  nodes.forEach(function (n) { (layers[n.layer] = layers[n.layer] || []).push(n); });
  layers = layers.filter(function (l) { return l && l.length; });
  layers.forEach(function (layer) {
    layer.forEach(function (n, i) { n.row = i; n.rowsOf = layer.length; });
  });
  for (var sweep = 0; sweep < 3; sweep++) {
    layers.forEach(function (layer, li) {
      if (li === 0) { return; }
      layer.forEach(function (n) {
        var s = 0, c = 0;
        n.inc.forEach(function (e) {
          var p = byId[e.source];
          if (p.row !== undefined) { s += (p.row + 0.5) / p.rowsOf; c++; }
        });
        n.key = c ? s / c : 1;
      });
      layer.sort(function (a, b) { return a.key - b.key; });
      layer.forEach(function (n, i) { n.row = i; });
    });
  }
  var svg = el("svg", {"id": "graph", "role": "img"}, document.getElementById("canvas"));
  var colW = 150, rowH = 30, tallest = 0;
  layers.forEach(function (l) { tallest = Math.max(tallest, l.length); });
  var W = 40 + layers.length * colW, canvasBox = svg.getBoundingClientRect();
  var aspect = canvasBox.width > 0 ? canvasBox.height / canvasBox.width : 0.6;
  var H = Math.max(200, tallest * rowH, (W + 60) * aspect - 20);  // fill the window's height
  layers.forEach(function (layer, li) {
    var gap = H / layer.length;
    layer.forEach(function (n, i) { n.x = 40 + li * colW; n.y = gap * (i + 0.5); });
  });
  var viewport = el("g", {"id": "viewport"}, svg);
  var edgeLayer = el("g", {"id": "edges"}, viewport);
  var nodeLayer = el("g", {"id": "nodes"}, viewport);
  var tip = document.getElementById("tip");

  function radius(n) {
    var base = n.kind === "token" ? 6 : 8;
    return base + Math.min(8, Math.log10(1 + n.count) * 1.6);
  }
  function pathOf(e) {
    var a = byId[e.source], b = byId[e.target];
    var mx = (a.x + b.x) / 2;
    return "M" + a.x + "," + a.y + " C" + mx + "," + a.y + " " + mx + "," + b.y + " " +
      b.x + "," + b.y;
  }
  edges.forEach(function (e, i) {
    var w = e.kind === "next" ? 0.8 + 9 * e.probability : 1;
    e.el = el("path", {"class": "edge " + e.kind, "d": pathOf(e), "stroke-width": w.toFixed(2),
                       "data-edge": String(i)}, edgeLayer);
    if (e.kind === "next") { e.el.style.stroke = colour(byId[e.source]); }
    e.el.addEventListener("mouseenter", function (ev) { showTip(ev, edgeTip(e)); });
    e.el.addEventListener("mousemove", moveTip);
    e.el.addEventListener("mouseleave", hideTip);
  });
  nodes.forEach(function (n) {
    var g = el("g", {"class": "node " + n.kind + (n.root ? " root" : ""), "data-node": n.id,
                     "transform": "translate(" + n.x + "," + n.y + ")"}, nodeLayer);
    el("circle", {"r": radius(n).toFixed(1), "fill": colour(n)}, g);
    var t = el("text", {"x": radius(n) + 4, "y": 4}, g);
    t.textContent = shortLabel(n);
    n.el = g;
    g.addEventListener("mouseenter", function (ev) {
      highlight(n, true); showTip(ev, nodeTip(n));
    });
    g.addEventListener("mousemove", moveTip);
    g.addEventListener("mouseleave", function () { highlight(n, false); hideTip(); });
    g.addEventListener("pointerdown", function (ev) { startDrag(ev, n); });
  });

  function nodeTip(n) {
    var lines = [];
    if (n.kind === "context") {
      lines.push(["context of order " + n.order + (n.root ? " (start)" : ""), null]);
      lines.push([JSON.stringify(n.text), "t"]);
      lines.push(["ids " + n.token_ids.join(" "), null]);
      lines.push(["seen " + n.count.toLocaleString("en") + " times, " +
                  n.successors.toLocaleString("en") + " distinct successors", null]);
    } else {
      lines.push(["token " + n.token_ids[0] + " (step " + Math.ceil(n.layer / 2) + ")", null]);
      lines.push([JSON.stringify(n.text), "t"]);
      lines.push(["followed the contexts drawn here " + n.count.toLocaleString("en") + " times",
                  null]);
    }
    return lines;
  }
  function edgeTip(e) {
    var a = byId[e.source], b = byId[e.target];
    if (e.kind === "then") {
      return [["then: the walk continues at the order-" + b.order + " context", null],
              [JSON.stringify(b.text), "t"]];
    }
    return [["P(" + JSON.stringify(b.text) + " | " + JSON.stringify(a.text) + ")", "t"],
            ["= " + (100 * e.probability).toFixed(1) + " %  (" + e.count.toLocaleString("en") +
             " of " + a.count.toLocaleString("en") + ")", null]];
  }
  function showTip(ev, lines) {
    while (tip.firstChild) { tip.removeChild(tip.firstChild); }
    lines.forEach(function (l) {
      var d = document.createElement("div");
      if (l[1]) { d.className = l[1]; }
      d.textContent = l[0];
      tip.appendChild(d);
    });
    tip.style.display = "block";
    moveTip(ev);
  }
  function moveTip(ev) {
    var box = document.getElementById("canvas").getBoundingClientRect();
    tip.style.left = Math.min(ev.clientX - box.left + 14, box.width - 300) + "px";
    tip.style.top = (ev.clientY - box.top + 14) + "px";
  }
  function hideTip() { tip.style.display = "none"; }
  function highlight(n, on) {
    var keep = {}; keep[n.id] = true;
    n.out.concat(n.inc).forEach(function (e) { keep[e.source] = keep[e.target] = true; });
    nodes.forEach(function (m) { m.el.classList.toggle("dim", on && !keep[m.id]); });
    edges.forEach(function (e) {
      var mine = e.source === n.id || e.target === n.id;
      e.el.classList.toggle("dim", on && !mine);
      e.el.classList.toggle("hl", on && mine);
    });
  }

  // Pan (drag the background), zoom (wheel), drag a node.
  var view = {x: 0, y: 0, k: 1}, drag = null;
  function apply() {
    viewport.setAttribute("transform",
                          "translate(" + view.x + "," + view.y + ") scale(" + view.k + ")");
  }
  function fit() {
    var box = svg.getBoundingClientRect();
    var k = Math.min(box.width / (W + 60), box.height / (H + 20), 1.6);
    view.k = k; view.x = (box.width - (W + 60) * k) / 2 + 10; view.y = (box.height - H * k) / 2;
    apply();
  }
  function startDrag(ev, n) {
    ev.stopPropagation();
    drag = {node: n, x: ev.clientX, y: ev.clientY, nx: n.x, ny: n.y};
  }
  svg.addEventListener("pointerdown", function (ev) {
    drag = {x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y};
    svg.classList.add("panning");
  });
  window.addEventListener("pointermove", function (ev) {
    if (!drag) { return; }
    if (drag.node) {
      var n = drag.node;
      n.x = drag.nx + (ev.clientX - drag.x) / view.k;
      n.y = drag.ny + (ev.clientY - drag.y) / view.k;
      n.el.setAttribute("transform", "translate(" + n.x + "," + n.y + ")");
      n.out.concat(n.inc).forEach(function (e) { e.el.setAttribute("d", pathOf(e)); });
    } else {
      view.x = drag.vx + ev.clientX - drag.x; view.y = drag.vy + ev.clientY - drag.y; apply();
    }
  });
  window.addEventListener("pointerup", function () {
    drag = null; svg.classList.remove("panning");
  });
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var box = svg.getBoundingClientRect(), px = ev.clientX - box.left, py = ev.clientY - box.top;
    var f = Math.exp(-ev.deltaY * 0.0015), k = Math.max(0.1, Math.min(8, view.k * f));
    view.x = px - (px - view.x) * k / view.k; view.y = py - (py - view.y) * k / view.k; view.k = k;
    apply();
  }, {passive: false});

  // Legend: the orders present, token nodes, edges.
  var legend = document.getElementById("legend");
  function item(fill, text, dashed) {
    var s = document.createElement("span");
    var sw = document.createElement("span");
    sw.className = "sw"; sw.style.background = fill;
    if (dashed) {
      sw.style.borderRadius = "0"; sw.style.height = "2px"; sw.style.border = "0";
      sw.style.borderTop = "2px dashed #8a8f98";
    }
    s.appendChild(sw); s.appendChild(document.createTextNode(text)); legend.appendChild(s);
  }
  var orders = {};
  nodes.forEach(function (n) { if (n.kind === "context") { orders[n.order] = true; } });
  Object.keys(orders).map(Number).sort(function (a, b) { return a - b; }).forEach(function (o) {
    item(ORDER_COLOURS[(o - 1) % 10], "order " + o);
  });
  item("#ffffff", "token");
  item("transparent", "then", true);
  var note = document.createElement("span");
  note.textContent = "edge width = P(token | context); hover for text and counts";
  legend.appendChild(note);
  var reset = document.createElement("button");
  reset.textContent = "fit"; reset.addEventListener("click", fit); legend.appendChild(reset);

  var summary = document.getElementById("summary");
  var contexts = nodes.filter(function (n) { return n.kind === "context"; }).length;
  summary.textContent = nodes.length + " nodes (" + contexts + " contexts, " +
    (nodes.length - contexts) + " tokens), " + edges.length + " edges" +
    (data.truncated ? ", cut at --max-nodes" : "");
  if (data.context_text !== null) {
    var c = document.getElementById("context");
    c.appendChild(document.createTextNode("context "));
    var code = document.createElement("code"); code.textContent = data.context_text;
    c.appendChild(code);
  }
  fit();
  window.addEventListener("resize", fit);
  document.body.setAttribute("data-rendered", String(nodes.length));
})();
"""


def _csp_hash(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def embed_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``<``, ``>`` or ``&`` appear literally."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_html(viz: VizGraph, *, title: str, subtitle: str = "") -> str:
    """The whole page as one string (UTF-8 when written)."""
    csp = (
        f"default-src 'none'; script-src {_csp_hash(SCRIPT)}; style-src {_csp_hash(STYLE)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{html.escape(csp, quote=False)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<div id="app">
<header>
<h1>{html.escape(title)}</h1>
<span class="meta">{html.escape(subtitle)}</span>
<span class="meta" id="context"></span>
<span class="meta" id="summary"></span>
<div id="legend"></div>
</header>
<div id="canvas"><div id="tip"></div></div>
</div>
<noscript>This page draws the graph with JavaScript; enable it to see the graph.</noscript>
<script type="application/json" id="graph-data">{embed_json(viz.to_json_dict())}</script>
<script>{SCRIPT}</script>
</body>
</html>
"""
