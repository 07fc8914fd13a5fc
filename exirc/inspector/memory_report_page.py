"""The memory plan page's style and script, inline so the page works offline.

The page is drawn in full by `memory_report_html` (linear scale, whole run),
so it reads without scripts. The script only redraws: each plot's boxes carry
their numbers as data attributes (`data-offset`, `data-bytes`, `data-first`,
`data-last`), and it recomputes every coordinate for

  * a log scale: the arena's offsets are cut at every tensor edge and each
    piece gets a height by the log of its bytes, so a 100 MB tensor next to
    1 KB ones no longer squeezes them into one flat line, while the order and
    overlaps of boxes stay as planned;
  * zoom: drag a rectangle over the plot to show that range of positions and
    offsets; double-click or "reset zoom" shows everything again.

The script uses no network, no storage and no `innerHTML`: it reads numbers
and writes attributes and text.
"""

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 2em; }
svg { width: 100%; max-width: 1100px; background: #fafafa; border: 1px solid #ddd;
      user-select: none; touch-action: none; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
.tensor { fill-opacity: 0.75; stroke: #333; stroke-width: 0.5; }
.tensor:hover { fill-opacity: 1; stroke-width: 1.5; }
.unused { fill: none; stroke: #999; stroke-dasharray: 4 3; }
.frame { fill: none; stroke: #888; }
.tick { stroke: #ccc; }
.loop { fill: #36c; fill-opacity: 0.07; stroke: none; }
.peak { stroke: #c00; stroke-width: 1.5; stroke-dasharray: 6 4; }
svg text.peak-label { fill: #c00; }
.brush { fill: #36c; fill-opacity: 0.15; stroke: #36c; stroke-width: 1; }
.controls { margin: 0.4em 0; display: flex; gap: 1.2em; align-items: center; }
.controls .hint { color: #777; font-size: 0.9em; }
table.largest { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.92em; }
table.largest th, table.largest td { border: 1px solid #ddd; padding: 0.2em 0.6em;
                                      text-align: left; vertical-align: top; }
table.largest td.bytes { text-align: right; white-space: nowrap; }
table.largest code { font-size: 0.95em; }
.warning { color: #a00; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  function num(el, name) { return Number(el.getAttribute("data-" + name)); }
  function bytesText(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let k = 0;
    while (Math.abs(n) >= 1024 && k < units.length - 1) { n /= 1024; k += 1; }
    return (k === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 1 : 0)) + " " + units[k];
  }
  // A monotone map from arena offsets to drawn heights: the offsets are cut at
  // every tensor edge, each piece drawn by its bytes (linear) or log2(1 + bytes).
  function scaleOf(edges, log) {
    const heights = [0];
    for (let i = 1; i < edges.length; i += 1) {
      const gap = edges[i] - edges[i - 1];
      heights.push(heights[i - 1] + (log ? Math.log2(1 + gap) : gap));
    }
    function lookup(from, to, x) {
      let lo = 0, hi = from.length - 1;
      if (x <= from[0]) { return to[0]; }
      if (x >= from[hi]) { return to[hi]; }
      while (hi - lo > 1) {
        const mid = (lo + hi) >> 1;
        if (from[mid] <= x) { lo = mid; } else { hi = mid; }
      }
      const span = from[hi] - from[lo];
      return to[lo] + (span ? (x - from[lo]) / span : 0) * (to[hi] - to[lo]);
    }
    return { total: heights[heights.length - 1] || 1,
             forward: function (x) { return lookup(edges, heights, x); },
             inverse: function (y) { return lookup(heights, edges, y); } };
  }
  function setup(figure) {
    const svg = figure.querySelector("svg");
    const ns = svg.namespaceURI;
    const plot = svg.getAttribute("data-plot").split(" ").map(Number);
    const left = plot[0], top = plot[1], width = plot[2], height = plot[3];
    const positions = num(svg, "positions");
    const boxes = Array.from(svg.querySelectorAll("[data-offset]"));
    const edgeSet = new Set([0, num(svg, "extent")]);
    boxes.forEach(function (b) {
      edgeSet.add(num(b, "offset"));
      edgeSet.add(num(b, "offset") + num(b, "bytes"));
    });
    const edges = Array.from(edgeSet).sort(function (a, b) { return a - b; });
    const axis = svg.querySelector("g.axis");
    const logBox = figure.querySelector("input.log-scale");
    let scale = scaleOf(edges, false);
    let view = { x0: 0, x1: positions, v0: 0, v1: scale.total };
    function X(p) { return left + (p - view.x0) / (view.x1 - view.x0) * width; }
    function Y(offset) {
      return top + (scale.forward(offset) - view.v0) / (view.v1 - view.v0) * height;
    }
    function add(parent, tag, attributes, text) {
      const el = document.createElementNS(ns, tag);
      Object.keys(attributes).forEach(function (k) { el.setAttribute(k, attributes[k]); });
      if (text !== undefined) { el.textContent = text; }
      parent.appendChild(el);
      return el;
    }
    function drawAxis() {
      while (axis.firstChild) { axis.removeChild(axis.firstChild); }
      const span = view.x1 - view.x0, step = Math.max(1, Math.ceil(span / 10));
      for (let p = Math.ceil(view.x0 / step) * step; p < view.x1; p += step) {
        add(axis, "text", { x: X(p + 0.5).toFixed(2), y: top + height + 16,
                            "text-anchor": "middle" }, String(p));
      }
      for (let k = 0; k <= 4; k += 1) {
        const y = top + height * k / 4;
        const offset = scale.inverse(view.v0 + (view.v1 - view.v0) * k / 4);
        add(axis, "line", { "class": "tick", x1: left, y1: y, x2: left + width, y2: y });
        add(axis, "text", { x: left - 6, y: y + 4, "text-anchor": "end" },
            bytesText(Math.round(offset)));
      }
    }
    function draw() {
      boxes.forEach(function (b) {
        const first = num(b, "first"), last = num(b, "last"), offset = num(b, "offset");
        const y = Y(offset), x = X(first);
        b.setAttribute("x", x.toFixed(2));
        b.setAttribute("width", Math.max(X(last + 1) - x, 0.5).toFixed(2));
        b.setAttribute("y", y.toFixed(2));
        b.setAttribute("height", Math.max(Y(offset + num(b, "bytes")) - y, 1).toFixed(2));
      });
      svg.querySelectorAll("path.loop").forEach(function (band) {
        const x = X(num(band, "first")), w = X(num(band, "last") + 1) - x;
        band.setAttribute("d", "M" + x.toFixed(2) + " " + top + "h" + w.toFixed(2) +
                          "v" + height + "h" + (-w).toFixed(2) + "z");
      });
      svg.querySelectorAll("[data-position]").forEach(function (mark) {
        const at = X(num(mark, "position") + 0.5), x = at.toFixed(2);
        if (mark.tagName === "line") { mark.setAttribute("x1", x); mark.setAttribute("x2", x); }
        else { mark.setAttribute("x", x); }
        mark.style.display = at < left || at > left + width ? "none" : "";
      });
      drawAxis();
    }
    function point(event) {
      const p = svg.createSVGPoint();
      p.x = event.clientX; p.y = event.clientY;
      return p.matrixTransform(svg.getScreenCTM().inverse());
    }
    function clamp(v, lo, hi) { return Math.min(Math.max(v, lo), hi); }
    let start = null, brush = null;
    svg.addEventListener("pointerdown", function (event) {
      start = point(event);
      brush = add(svg, "rect", { "class": "brush", x: start.x, y: start.y, width: 0, height: 0 });
      svg.setPointerCapture(event.pointerId);
    });
    svg.addEventListener("pointermove", function (event) {
      if (!start) { return; }
      const p = point(event);
      brush.setAttribute("x", Math.min(p.x, start.x));
      brush.setAttribute("width", Math.abs(p.x - start.x));
      brush.setAttribute("y", Math.min(p.y, start.y));
      brush.setAttribute("height", Math.abs(p.y - start.y));
    });
    svg.addEventListener("pointerup", function (event) {
      if (!start) { return; }
      const p = point(event), from = start;
      start = null; svg.removeChild(brush); brush = null;
      if (Math.abs(p.x - from.x) > 3) {
        const fx = (clamp(Math.min(p.x, from.x), left, left + width) - left) / width;
        const tx = (clamp(Math.max(p.x, from.x), left, left + width) - left) / width;
        const span = view.x1 - view.x0, x0 = view.x0 + fx * span;
        view.x1 = Math.max(view.x0 + tx * span, x0 + 1);
        view.x0 = x0;
      }
      if (Math.abs(p.y - from.y) > 3) {
        const fy = (clamp(Math.min(p.y, from.y), top, top + height) - top) / height;
        const ty = (clamp(Math.max(p.y, from.y), top, top + height) - top) / height;
        const span = view.v1 - view.v0, v0 = view.v0 + fy * span;
        view.v1 = Math.max(view.v0 + ty * span, v0 + 1e-9);
        view.v0 = v0;
      }
      draw();
    });
    function reset() { view = { x0: 0, x1: positions, v0: 0, v1: scale.total }; draw(); }
    svg.addEventListener("dblclick", reset);
    figure.querySelector("button.reset-zoom").addEventListener("click", reset);
    logBox.addEventListener("change", function () {
      scale = scaleOf(edges, logBox.checked);
      reset();
    });
    figure.querySelector(".controls").hidden = false;
  }
  document.querySelectorAll("div.arena-plot").forEach(setup);
})();
"""
